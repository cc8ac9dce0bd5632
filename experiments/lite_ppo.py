"""Lite PPO: group-mean advantages scaled by the batch std, token-level loss aggregation.

Liu et al. 2025, "Part I: Tricks or Traps? A Deep Dive into RL for LLM Reasoning",
arXiv:2508.08221: of the tricks studied, these two alone (advantage normalisation with
the group mean and the batch std; token-level loss) let a PPO-style loss without a
critic match or beat GRPO and DAPO on their base models.
"""

from rljax.train.config import base_config


def get_config(arg=None):
  del arg
  c = base_config()
  c.run.dir = "runs/lite_ppo"
  c.algo.advantage = "batch_std"
  c.algo.loss_agg = "token_mean"
  return c
