"""Entropy tricks, one per step: bonus, high-entropy token mask, Clip-Cov, KL-Cov.

- "bonus": an entropy bonus in the loss (coefficient 0.001).
- "high_entropy_mask": gradient only through the top-20% entropy ("forking") tokens,
  Wang et al. 2025, arXiv:2506.01939.
- "clip_cov" / "kl_cov": Cui et al. 2025, "The Entropy Mechanism of Reinforcement
  Learning for Reasoning Language Models", arXiv:2505.22617, Sec. 4 (ratios as in the
  verl recipes, scaled up for a tiny batch so that some tokens are selected).
"""

from rljax.train.config import base_config

ABLATION_STEPS = ("baseline", "bonus", "high_entropy_mask", "clip_cov", "kl_cov")


def get_config(arg=None):
  step = arg or "bonus"
  if step not in ABLATION_STEPS:
    raise ValueError(f"unknown entropy step {step!r}; valid: {list(ABLATION_STEPS)}")
  c = base_config()
  c.run.dir = f"runs/entropy_{step}"
  c.algo.loss_agg = "token_mean"
  if step == "bonus":
    c.algo.entropy_coef = 0.001
  elif step == "high_entropy_mask":
    c.algo.high_entropy_fraction = 0.2
  elif step == "clip_cov":
    c.algo.policy_loss = "clip_cov"
    c.algo.clip_cov_ratio = 0.02
  elif step == "kl_cov":
    c.algo.policy_loss = "kl_cov"
    c.algo.kl_cov_ratio = 0.02
  return c
