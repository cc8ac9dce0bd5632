"""RLOO: leave-one-out baseline, no std scaling.

Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style Optimization for
Learning from Human Feedback in LLMs", arXiv:2402.14740, Eq. 5.
"""

from rljax.train.config import base_config


def get_config(arg=None):
  del arg
  c = base_config()
  c.run.dir = "runs/rloo"
  c.algo.advantage = "rloo"
  return c
