"""ReMax: REINFORCE with the greedy completion's reward as the baseline.

Li et al. 2023, "ReMax", arXiv:2310.10505, Algorithm 1. One extra greedy rollout per
prompt per iteration.
"""

from rljax.train.config import base_config


def get_config(arg=None):
  del arg
  c = base_config()
  c.run.dir = "runs/remax"
  c.algo.advantage = "remax"
  return c
