"""GRPO with LoRA adapters on every projection, at ranks 1, 8 and 32.

Hu et al. 2021, "LoRA", arXiv:2106.09685; for RL, "LoRA Without Regret" (Schulman &
Thinking Machines 2025): adapters on all weight matrices, MLP included, match full
fine-tuning even at rank 1, at about 10x the full fine-tuning learning rate, with α fixed
(32) so the 1/r scaling keeps that rate roughly independent of the rank. The base (the
SFT warm start, shared with full fine-tuning through the SFT cache) stays frozen; the KL
reference, when one is used, is the base with the adapters off.

    rljax ablate experiments/lora.py --seeds 0,1,2
    rljax train --config experiments/lora.py:r8
"""

from rljax.train.config import base_config

ABLATION_STEPS = ("full", "r1", "r8", "r32")
LR_MULTIPLIER = 10.0   # LoRA Without Regret: LoRA's best lr is ~10x full fine-tuning's


def get_config(arg=None):
  step = arg or "r8"
  if step not in ABLATION_STEPS:
    raise ValueError(f"unknown lora step {step!r}; valid: {list(ABLATION_STEPS)}")
  c = base_config()
  c.run.dir = f"runs/lora_{step}"
  if step != "full":
    c.model.lora_rank = int(step[1:])
    c.optim.actor_lr = c.optim.actor_lr * LR_MULTIPLIER
  return c
