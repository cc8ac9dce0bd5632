"""GRPO: group-normalised advantages, PPO clip, no critic (the embedded default).

Shao et al. 2024, "DeepSeekMath", arXiv:2402.03300, Sec. 4.1. The base config already
is GRPO on the synthetic arithmetic task; this file only names the run.
"""

from rljax.train.config import base_config


def get_config(arg=None):
  del arg
  c = base_config()
  c.run.dir = "runs/grpo"
  return c
