"""GMPO: the geometric mean of token ratios per sequence, each token clipped in log space.

"GMPO: Geometric-Mean Policy Optimization", arXiv:2507.20673 (verl `geo_mean`). The
geometric mean is less sensitive to one outlier token than GRPO's arithmetic mean of
ratios, which allows the wider clip range (e^−0.4, e^0.4). Two minibatches so the
ratio leaves 1.
"""

from rljax.train.config import base_config


def get_config(arg=None):
  del arg
  c = base_config()
  c.run.dir = "runs/gmpo"
  c.algo.policy_loss = "geo_mean"
  c.algo.eps_low = 0.4          # log-space clip range [-0.4, 0.4]
  c.algo.eps_high = 0.4
  c.algo.minibatches = 2
  return c
