"""Asynchronous rollouts on the main job: how much staleness costs, and what correcting it
buys.

Batch t is sampled by policy version max(0, t - k) while the trainer updates
(`sampling.max_staleness` = k; one-step off-policy at k = 1, as verl's; AReaL bounds
staleness the same way, Fu et al. 2025, arXiv:2505.24298). Without correction the PPO
ratio is taken against the recomputed (proximal) policy and the samples' staleness is
ignored; `decoupled` is AReaL's decoupled objective (Eq. 5): the behaviour policy only
reweights (prox/behaviour, capped), the clip is centred on the proximal policy.
`partial`: partial rollouts, requests in flight at a weight handoff continue with the new
weights (segment s of batch t's completions by version min(t, t - k + s)).

    rljax ablate experiments/async.py --seeds 0-2
"""

from rljax.train.config import base_config

ABLATION_STEPS = ("sync", "k1", "k1_decoupled", "k2", "k2_decoupled", "k1_partial",
                  "k2_partial")
MECHANISMS = {step: "staleness/mean" for step in ABLATION_STEPS[1:]}


def get_config(arg=None):
  step = arg or ABLATION_STEPS[1]
  if step not in ABLATION_STEPS:
    raise ValueError(f"unknown async step {step!r}; valid: {list(ABLATION_STEPS)}")
  c = base_config()
  c.run.dir = f"runs/async_{step}"
  if step != "sync":
    c.sampling.max_staleness = int(step[1])
  if step.endswith("decoupled"):
    c.algo.off_policy_correction = "decoupled"
  if step.endswith("partial"):
    c.sampling.partial_rollouts = True
  return c
