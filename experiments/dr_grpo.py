"""Dr.GRPO: no std in the advantage, a constant length normaliser in the loss.

Liu et al. 2025, "Understanding R1-Zero-Like Training: A Critical Perspective",
arXiv:2503.20783, Sec. 3.2: both biases of GRPO (question-level difficulty via the std,
response length via the per-sequence mean) are removed.
"""

from rljax.train.config import base_config


def get_config(arg=None):
  del arg
  c = base_config()
  c.run.dir = "runs/dr_grpo"
  c.algo.advantage = "dr_grpo"
  c.algo.loss_agg = "seq_mean_token_sum_norm"
  return c
