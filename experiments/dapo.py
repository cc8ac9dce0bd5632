"""DAPO as an ablation, in the order of the paper's Table 1.

Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale",
arXiv:2503.14476. Each step adds one technique to the previous ones (the paper's Table 1):
naive GRPO -> overlong filtering -> clip-higher (eps_high 0.28) -> soft overlong
punishment -> token-level loss -> dynamic sampling. The paper drops the KL term
(coefficient 0); lengths are scaled to this task: the base config's 36-token budget
binds on 5-term scratchpads, and the soft punishment's buffer is its last 8 tokens.

Each trick gets the condition it exists for on the base regime: 8 updates per rollout
(ratios leave 1, so clipping acts), a length budget that long scratchpads reach
(truncation, the overlong buffer), lengths from 5 to 36 tokens (token- vs sequence-level
aggregation differ), and groups of 8 that saturate as accuracy rises (dynamic sampling).

    rljax ablate experiments/dapo.py --seeds 0-7 --aa
    rljax train --config experiments/dapo.py:clip_higher
"""

from rljax.train.config import base_config

ABLATION_STEPS = ("naive_grpo", "overlong_filtering", "clip_higher", "soft_overlong",
                  "token_level_loss", "dynamic_sampling")
# The metric each step's trick acts on (the paper's Figs. 2-5): the report gives its paired
# change beside the verdicts.
MECHANISMS = {"overlong_filtering": "train/truncated_loss_tokens",
              "clip_higher": "update/clip_high", "soft_overlong": "train/truncated_frac",
              "token_level_loss": "train/length_incorrect",
              "dynamic_sampling": "train/effective_batch"}


def get_config(arg=None):
  step = arg or ABLATION_STEPS[-1]
  if step not in ABLATION_STEPS:
    raise ValueError(f"unknown DAPO step {step!r}; valid: {list(ABLATION_STEPS)}")
  on = set(ABLATION_STEPS[:ABLATION_STEPS.index(step) + 1])
  c = base_config()
  c.run.dir = f"runs/dapo_{step}"
  c.algo.overlong_filter = "overlong_filtering" in on and "soft_overlong" not in on
  if "clip_higher" in on:
    c.algo.eps_high = 0.28                    # eps_low stays 0.2
  if "soft_overlong" in on:
    c.algo.soft_overlong = True               # buffer: the last algo.overlong_cache_len = 8
  if "token_level_loss" in on:
    c.algo.loss_agg = "token_mean"
  if "dynamic_sampling" in on:
    c.algo.dynamic_sampling = True
    # The verl DAPO recipe stops at 10 generation rounds; on this task one seed's policy
    # saturates (seed 3, iteration 43: 14 of 16 groups with mixed outcomes in 160 drawn), so
    # the limit is 30: DAPO's own rule is to sample until the batch is full (Sec. 3.2).
    c.algo.dynamic_sampling_max_rounds = 30
  return c
