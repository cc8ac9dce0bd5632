"""Policy losses of the form L_t = −w_t·A_t·logπ_θ(y_t) with a stop-gradient weight w: CISPO
(a clipped importance weight, the clipped token keeps its gradient) and REINFORCE (w = 1 or
the plain ratio).

Same contract as `rljax.ops.policy_loss` (which registers them and re-exports them):
`fn(logp, old_logp, advantages, mask, **hyper) -> (loss_bt [B, T],
PolicyLossDiagnostics)`, a loss to minimise, 0 at masked positions.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rljax.ops.policy_loss_common import advantages_bt, diagnostics, zero_masked
from rljax.ops.ratios import token_log_ratio

CISPO_CONVENTIONS = ("two_sided", "absolute_cap")


def cispo_loss(logp, old_logp, advantages, mask, *, convention="two_sided", eps_low=None,
               eps_high=0.2, cap=5.0):
  """CISPO: clipped, stop-gradient IS weight times log-prob, L = −sg(ŵ)·A·logπ_θ.

  MiniMax-M1 (MiniMax 2025, "MiniMax-M1: Scaling Test-Time Compute Efficiently with
  Lightning Attention", arXiv:2506.13585, Eqs. 4–5). Unlike PPO, a clipped token keeps its
  gradient −ŵ·A·∇logπ; only the weight is bounded. Two parameterisations of ŵ exist
  (verl `verl/trainer/ppo/core_algos.py` and TRL `trl/trainer/grpo_config.py`), chosen by name:
    "two_sided"    ŵ = clip(r, 1 − ε_low, 1 + ε_high)  (paper Eq. 5, verl). `eps_low=None`
                   means no lower bound, as the paper (and verl's example, ε_low = 10) use.
    "absolute_cap" ŵ = min(r, cap)                     (TRL, `cap` = its `epsilon_high`,
                   "recommended 5.0").

  Note: the loss *value* −ŵ·A·logπ depends on the absolute log-prob; only its gradient is
  meaningful. The paper normalises by the total token count: aggregate with "token_mean".
  `clip_high_bt` marks r above the upper bound for any sign of A (TRL counts A > 0 only).

  Args:
    logp, old_logp: current / old log-probs of the sampled tokens, [B, T].
    advantages: [B] or [B, T].
    mask: completion mask, [B, T].
    convention: "two_sided" or "absolute_cap".
    eps_low: lower range for "two_sided" (None: no lower bound).
    eps_high: upper range for "two_sided".
    cap: absolute cap for "absolute_cap".
  Returns:
    (loss_bt [B, T], PolicyLossDiagnostics).
  """
  if convention not in CISPO_CONVENTIONS:
    raise ValueError(f"Unknown CISPO convention {convention!r}; valid: {CISPO_CONVENTIONS}")
  adv = advantages_bt(advantages, mask)
  log_r = token_log_ratio(logp, old_logp, mask)
  ratio = jnp.exp(log_r)
  if convention == "two_sided":
    low = 0.0 if eps_low is None else 1.0 - eps_low
    high = 1.0 + eps_high
  else:
    low, high = 0.0, cap
  weight = jax.lax.stop_gradient(jnp.clip(ratio, low, high))
  logp = jnp.where(mask > 0, logp.astype(jnp.float32), 0.0)
  loss = -weight * adv * logp
  diag = diagnostics(mask, ratio, log_r, clip_low_bt=ratio < low, clip_high_bt=ratio > high)
  return zero_masked(loss, mask), diag


def reinforce_loss(logp, old_logp, advantages, mask, *, importance_weight=False):
  """Vanilla policy gradient (REINFORCE): L = −w·A·logπ_θ with w = sg(r) or 1.

  Williams 1992, "Simple statistical gradient-following algorithms for connectionist
  reinforcement learning" (Machine Learning 8, no arXiv id), the REINFORCE rule
  Δθ ∝ (R − b)·∇logπ; with
  `importance_weight=True` the off-policy estimator −sg(r)·A·logπ, whose gradient equals
  that of −r·A (Schulman et al. 2017, arXiv:1707.06347, Eq. 6, the CPI surrogate).

  Note: the weight is not truncated; use `cispo_loss` for a truncated one.

  Args:
    logp, old_logp: current / old log-probs of the sampled tokens, [B, T].
    advantages: [B] or [B, T].
    mask: completion mask, [B, T].
    importance_weight: multiply by the stop-gradient token ratio r = π_θ/π_old.
  Returns:
    (loss_bt [B, T], PolicyLossDiagnostics).
  """
  adv = advantages_bt(advantages, mask)
  log_r = token_log_ratio(logp, old_logp, mask)
  ratio = jnp.exp(log_r)
  weight = jax.lax.stop_gradient(ratio) if importance_weight else 1.0
  logp = jnp.where(mask > 0, logp.astype(jnp.float32), 0.0)
  loss = -weight * adv * logp
  return zero_masked(loss, mask), diagnostics(mask, ratio, log_r)
