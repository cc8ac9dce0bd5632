"""GSPO: sequence-level, length-normalised importance ratio with a sequence-level clip.

Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv:2507.18071. The clip range
is tiny (verl / TRL recipes: 3e-4 / 4e-4) because the ratio is a geometric mean. The ratio
only departs from 1 off-policy, so the batch is split into two minibatches.
`arg == "token"` selects GSPO-token (sequence ratio value, per-token gradient).
"""

from rljax.train.config import base_config


def get_config(arg=None):
  c = base_config()
  c.run.dir = "runs/gspo" + (f"_{arg}" if arg else "")
  c.algo.ratio_level = "sequence_token" if arg == "token" else "sequence"
  c.algo.eps_low = 3e-4
  c.algo.eps_high = 4e-4
  c.algo.minibatches = 2
  return c
