"""GPG: plain policy gradient with an α-rescaled group-mean advantage; no ratio, no clip.

Chu et al. 2025, "GPG: A Simple and Strong Reinforcement Learning Baseline for Model
Reasoning", arXiv:2504.02546 (verl `gpg` loss and advantage): L = −A·logπ, with
A = α(r − mean_g r), α = N/(N − M) compensating the M samples of all-equal groups.
"""

from rljax.train.config import base_config


def get_config(arg=None):
  del arg
  c = base_config()
  c.run.dir = "runs/gpg"
  c.algo.advantage = "gpg"
  c.algo.policy_loss = "gpg"
  c.algo.loss_agg = "token_mean"
  return c
