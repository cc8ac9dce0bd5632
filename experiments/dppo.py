"""DPPO: a trust region on the sampled token's probability instead of on the ratio.

"Rethinking the Trust Region in LLM Reinforcement Learning", arXiv:2602.04879 (verl
`dppo_tv`, `dppo_kl`). `arg`: "tv" (default; |π − π_old| bounded) or "kl" (binary KL
between the old and new probability of the token bounded). The thresholds below are
illustrative for this tiny task, not the paper's recipe values. Two minibatches so the
policy moves within the rollout.
"""

from rljax.train.config import base_config


def get_config(arg=None):
  divergence = arg or "tv"
  if divergence not in ("tv", "kl"):
    raise ValueError(f"experiments/dppo.py: arg must be 'tv' or 'kl', got {arg!r}")
  c = base_config()
  c.run.dir = f"runs/dppo_{divergence}"
  c.algo.policy_loss = f"dppo_{divergence}"
  if divergence == "kl":          # tv keeps the base thresholds, 0.15
    c.algo.dppo_delta_low = c.algo.dppo_delta_high = 0.05
  c.algo.loss_agg = "token_mean"
  c.algo.minibatches = 2
  return c
