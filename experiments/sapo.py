"""SAPO: a soft sigmoid gate on the token ratio in place of PPO's hard clip.

"Soft Adaptive Policy Optimization", arXiv:2511.20347 (verl `sapo`, TRL `sapo`): the
gate (4/τ)·σ(τ(r − 1)) gives on-policy tokens the usual gradient and fades it smoothly
as r leaves 1, faster for negative advantages (the base config's τ_neg = 1.05 > τ_pos = 1).
Aggregation seq_mean_token_mean (the base's), as in the paper. Two minibatches so the ratio leaves 1.
"""

from rljax.train.config import base_config


def get_config(arg=None):
  del arg
  c = base_config()
  c.run.dir = "runs/sapo"
  c.algo.policy_loss = "sapo"
  c.algo.minibatches = 2
  return c
