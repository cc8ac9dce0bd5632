"""CISPO: clipped, stop-gradient importance weight times log-prob; clipped tokens keep a gradient.

MiniMax 2025, "MiniMax-M1", arXiv:2506.13585, Eq. 4-5. `arg`: "two_sided" (verl's
1 ± eps with no effective lower bound, cap 1 + 0.2) or "absolute_cap" (TRL: min(r, 5)).
"""

from rljax.train.config import base_config


def get_config(arg=None):
  c = base_config()
  convention = arg or "two_sided"
  c.run.dir = f"runs/cispo_{convention}"
  c.algo.policy_loss = "cispo"
  c.algo.cispo_convention = convention
  c.algo.eps_low = 0.99          # no effective lower bound; eps_high 0.2: cap 1.2
  c.algo.loss_agg = "token_mean"
  c.algo.minibatches = 2
  return c
