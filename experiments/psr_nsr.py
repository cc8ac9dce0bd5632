"""Positive / negative sample reinforcement and W-REINFORCE.

Zhu et al. 2025, "The Surprising Effectiveness of Negative Reinforcement in LLM
Reasoning", arXiv:2506.01347. Steps: "psr" (only positive samples), "nsr" (only
negative samples), "w_reinforce" (positive samples weighted by 0.1, the paper's choice).
"""

from rljax.train.config import base_config

WEIGHTS = {"psr": (1.0, 0.0), "nsr": (0.0, 1.0), "w_reinforce": (0.1, 1.0)}
ABLATION_STEPS = tuple(WEIGHTS)


def get_config(arg=None):
  step = arg or "w_reinforce"
  if step not in WEIGHTS:
    raise ValueError(f"unknown psr_nsr step {step!r}; valid: {list(WEIGHTS)}")
  c = base_config()
  c.run.dir = f"runs/psr_nsr_{step}"
  c.algo.policy_loss = "reinforce"
  c.algo.advantage = "dr_grpo"
  c.algo.psr_weight, c.algo.nsr_weight = WEIGHTS[step]
  return c
