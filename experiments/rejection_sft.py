"""Rejection-sampling fine-tuning alternated with GRPO (Llama 2 style).

Touvron et al. 2023, "Llama 2: Open Foundation and Fine-Tuned Chat Models",
arXiv:2307.09288, Sec. 3.2.3: sample K outputs per prompt, keep the best by reward,
fine-tune on them; rounds alternate with the RL update (PPO there, GRPO here). Before
every 10th GRPO iteration (0, 10, ...) a phase samples K=8 completions for 32 prompts and
takes 2 NLL steps (AdamW, lr 3e-4) on the kept ones (`rljax.train.rejection_sft`; K,
prompts, steps and lr are the base config's `algo.rsft_*` defaults).

Steps: "off" (plain GRPO, the baseline), "best" (keep each prompt's best whatever its
score, as Llama 2 does with a reward model), "correct" (default: keep the best only if
it is correct, total score >= 1.0 = accuracy 1).
"""

from rljax.train.config import base_config

ABLATION_STEPS = ("off", "best", "correct")


def get_config(arg=None):
  step = arg or "correct"
  if step not in ABLATION_STEPS:
    raise ValueError(f"unknown rejection_sft step {step!r}; valid: {list(ABLATION_STEPS)}")
  c = base_config()
  c.run.dir = f"runs/rejection_sft_{step}"
  if step != "off":
    c.algo.rsft_every = 10
  if step == "correct":
    c.algo.rsft_min_score = 1.0   # keep the best only if correct (best: whatever its score)
  return c
