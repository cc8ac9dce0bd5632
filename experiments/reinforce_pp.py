"""REINFORCE++: token-level returns with the KL penalty in the reward, global whitening.

Hu 2025, "REINFORCE++", arXiv:2501.03262. `arg == "baseline"` selects
REINFORCE++-baseline (group-mean baseline, then batch whitening).
"""

from rljax.train.config import base_config


def get_config(arg=None):
  c = base_config()
  c.run.dir = "runs/reinforce_pp" + (f"_{arg}" if arg else "")
  c.algo.advantage = "reinforce_pp_baseline" if arg == "baseline" else "reinforce_pp"
  c.algo.kl_placement = "reward"
  c.algo.kl_estimator = "k1"
  c.algo.kl_coef = 0.01
  c.algo.loss_agg = "token_mean"
  return c
