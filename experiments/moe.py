"""A mixture-of-experts policy on the embedded task, sampled in bf16 while training stays in
float32, and the paired ablation of the two corrections of that mismatch.

The tiny decoder's MLPs become Qwen3-MoE blocks: 4 experts of width 96, top 2 (192 active
units per token against the dense job's 384; XLA:CPU computes `ragged_dot` as 4 masked dense
matmuls, so an MLP costs about what the dense one does). The sampler runs a bf16 copy of the
policy (`sampling.sampler_dtype`): its rounding moves some tokens to other experts, which
the trainer's float32 forward does not follow, so the log-prob gap is a MoE one (verl's docs
call rollout correction "required even for BF16" on MoE).

Steps, each against the first (no correction):
  none    PPO/GRPO on the sampler's tokens, old log-probs recomputed by the trainer
  tis     truncated importance sampling of the train-inference gap (algo.is_correction)
  replay  routing replay, R3 (Ma et al. 2025, arXiv:2510.11370): the trainer's forwards use
          the experts the sampler chose (algo.routing_replay='sampler')
  both    replay and TIS

Every step logs moe/routing_flip_rate, moe/expert_load_max and the log-prob gap with and
without replay (mismatch/logp_gap_mean_replay, mismatch/logp_gap_mean_no_replay).

    rljax train --config experiments/moe.py:replay
    rljax ablate experiments/moe.py --seeds 0-3
"""

from rljax.train.config import base_config

ABLATION_STEPS = ("none", "tis", "replay", "both")
# What each correction acts on: the gap the trainer's old log-probs keep to the sampler's.
MECHANISMS = {"replay": "mismatch/logp_gap_mean", "both": "mismatch/logp_gap_mean"}


def get_config(arg=None):
  step = arg or "replay"
  if step not in ABLATION_STEPS:
    raise ValueError(f"unknown moe step {step!r}; valid: {list(ABLATION_STEPS)}")
  c = base_config()
  c.run.dir = f"runs/moe_{step}"
  c.model.num_experts, c.model.num_experts_per_tok = 4, 2
  c.model.moe_intermediate_size = 96
  c.sampling.sampler_dtype = "bfloat16"
  if step in ("tis", "both"):
    c.algo.is_correction = "tis"       # cap algo.tis_cap = 2
  if step in ("replay", "both"):
    c.algo.routing_replay = "sampler"
  return c
