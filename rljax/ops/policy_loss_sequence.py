"""Policy losses of the 2025–26 catalogue on a sequence-level ratio: GMPO (geometric mean of
clipped token ratios), LUSPO (length-weighted GSPO) and VESPO (Gamma-weighted sequence IS).

Same contract as `rljax.ops.policy_loss`: `fn(logp, old_logp, advantages, mask, **hyper)
-> (loss_bt [B, T], PolicyLossDiagnostics)`, a loss to minimise, 0 at masked positions;
each token row carries its sequence's value. Registered by name in
`rljax.ops.policy_loss_gated.GATED_LOSSES`.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from rljax.ops.policy_loss_common import advantages_bt, diagnostics, zero_masked
from rljax.ops.ratios import LOG_RATIO_CLAMP, sequence_log_ratio, token_log_ratio


def gmpo_loss(logp, old_logp, advantages, mask, *, eps_low=0.4, eps_high=0.4):
  """GMPO: the geometric mean of token ratios, each clipped in log space, per sequence.

  For sequence i with advantage A_i (sgn = sign A_i) and token log-ratios ℓ_t:
    ℓ̂_t = sgn·min(sgn·ℓ_t, sgn·clip(ℓ_t, −ε_low, ε_high)),
    ρ_i = exp((1/|y_i|) Σ_t ℓ̂_t),     L_i = −A_i·ρ_i
  ("GMPO: Geometric-Mean Policy Optimization", arXiv:2507.20673, the GMPO objective
  with its token-level clip in log space, range (e^−0.4, e^0.4); verl `geo_mean`).
  A token clipped on the side the advantage favours gets no gradient; the others get
  −A_i·ρ_i/|y_i|·∇logπ_t. With |y_i| = 1 this is token PPO with ratio bounds
  (e^−ε_low, e^ε_high).

  Note: each token row carries its sequence's L_i, so `seq_mean_token_mean` gives the
  paper's (1/G)Σ_i L_i (verl takes a plain mean over sequences). Advantages should be
  per sequence; a [B, T] input is averaged over each sequence's tokens (as verl does).
  The log-ratio is clamped to ±20 before clipping (a no-op for any sensible ε).

  Args:
    logp, old_logp: current / old log-probs, [B, T].
    advantages: [B] or [B, T].
    mask: completion mask, [B, T].
    eps_low, eps_high: clip range of the token log-ratio, [−ε_low, ε_high].
  Returns:
    (loss_bt [B, T], PolicyLossDiagnostics); clip flags per token, ratio_bt = ρ_i.
  """
  adv_bt = advantages_bt(advantages, mask)
  keep = (mask > 0).astype(jnp.float32)
  length = jnp.maximum(jnp.sum(keep, axis=1), 1.0)
  adv_b = jnp.sum(adv_bt, axis=1) / length
  sgn = jnp.sign(adv_b)[:, None]
  log_r = token_log_ratio(logp, old_logp, mask)
  clipped = jnp.clip(log_r, -eps_low, eps_high)
  log_hat = sgn * jnp.minimum(sgn * log_r, sgn * clipped)
  rho_b = jnp.exp(jnp.sum(log_hat * keep, axis=1) / length)
  loss = jnp.broadcast_to((-adv_b * rho_b)[:, None], mask.shape)
  out = log_r != clipped
  diag = diagnostics(mask, jnp.broadcast_to(rho_b[:, None], mask.shape), log_r,
                     clip_high_bt=out & (sgn > 0) & (log_r > eps_high),
                     clip_low_bt=out & (sgn < 0) & (log_r < -eps_low))
  return zero_masked(loss, mask), diag


def luspo_loss(logp, old_logp, advantages, mask, *, eps_low=0.2, eps_high=0.2):
  """LUSPO: GSPO's clipped sequence surrogate, each sequence weighted by its length.

  L = (1/G) Σ_i |y_i|·max(−s_i A_i, −clip(s_i, 1 − ε_low, 1 + ε_high) A_i), with the
  GSPO ratio s_i = exp((1/|y_i|) Σ_t ℓ_{i,t}) (LUSPO: "Length-Unbiased Sequence Policy
  Optimization", arXiv:2602.05261; TRL `loss_type="luspo"` with sequence-level IS).
  GSPO's per-sequence mean makes a long sequence's tokens weigh less; the |y_i| factor
  removes that length bias.

  Note: every token row carries its sequence's clipped surrogate (as GSPO in
  `policy_loss`), so the |y_i| weight comes from aggregating with "seq_mean_token_sum"
  (Σ_t over the row = |y_i|·L_i, then the mean over sequences) — the trainer requires it.

  Args:
    logp, old_logp: current / old log-probs, [B, T].
    advantages: [B] or [B, T].
    mask: completion mask, [B, T].
    eps_low, eps_high: clip range of s_i.
  Returns:
    (loss_bt [B, T], PolicyLossDiagnostics).
  """
  adv = advantages_bt(advantages, mask)
  log_r_token = token_log_ratio(logp, old_logp, mask)
  s = jnp.broadcast_to(jnp.exp(sequence_log_ratio(logp, old_logp, mask))[:, None], mask.shape)
  loss = jnp.maximum(-adv * s, -adv * jnp.clip(s, 1.0 - eps_low, 1.0 + eps_high))
  diag = diagnostics(mask, s, log_r_token, clip_low_bt=(adv < 0) & (s < 1.0 - eps_low),
                     clip_high_bt=(adv > 0) & (s > 1.0 + eps_high))
  return zero_masked(loss, mask), diag


def vespo_weights(logp, old_logp, advantages, mask, *, k_pos=2.0, lambda_pos=3.0,
                  k_neg=3.0, lambda_neg=2.0):
  """VESPO's Gamma weight of the sequence IS ratio, φ(w) = w^k·e^{λ(1 − w)} (φ(1) = 1).

  w_i = Π_t r_{i,t} = exp(Σ_t ℓ_{i,t}) (the full product, not GSPO's geometric mean),
  (k, λ) = (k_pos, λ_pos) if A_i ≥ 0 else (k_neg, λ_neg). φ rises like w^k below 1 and
  decays like e^{−λw} above, so stale sequences in either direction are down-weighted.

  Note: log w is clamped to [log 1e-8, 20] (TRL); λ to ≥ 1e-4; non-finite φ → 0.

  Returns:
    φ, float32 [B], without gradient.
  """
  adv = advantages_bt(advantages, mask)
  keep = (mask > 0).astype(jnp.float32)
  log_w = jnp.sum(token_log_ratio(logp, old_logp, mask) * keep, axis=1)
  log_w = jnp.clip(log_w, math.log(1e-8), LOG_RATIO_CLAMP)
  adv_b = jnp.sum(adv, axis=1) / jnp.maximum(jnp.sum(keep, axis=1), 1.0)
  nonneg = adv_b >= 0
  k = jnp.where(nonneg, k_pos, k_neg)
  lam = jnp.maximum(jnp.where(nonneg, lambda_pos, lambda_neg), 1e-4)
  phi = jnp.exp(lam + k * log_w - lam * jnp.exp(log_w))
  return jax.lax.stop_gradient(jnp.where(jnp.isfinite(phi), phi, 0.0))


def vespo_loss(logp, old_logp, advantages, mask, *, k_pos=2.0, lambda_pos=3.0, k_neg=3.0,
               lambda_neg=2.0):
  """VESPO: L_t = −sg(φ(w_i))·A_t·logπ_θ(y_t), a smooth Gamma-shaped sequence IS weight.

  "VESPO: Variational Sequence-Level Soft Policy Optimization", arXiv:2602.10693 (the
  Gamma weighting φ(w) = e^λ·w^k·e^{−λw}; TRL `loss_type="vespo"`, defaults k_pos = 2,
  λ_pos = 3, k_neg = 3, λ_neg = 2); see `vespo_weights`.

  Note: the loss value depends on logπ; only the gradient sg(φ)·A·∇logπ is meaningful.
  TRL aggregates over the global token count: use "token_mean". The sign of a [B, T]
  advantage is taken from its sequence mean.

  Args:
    logp, old_logp: current / old log-probs, [B, T].
    advantages: [B] or [B, T].
    mask: completion mask, [B, T].
    k_pos, lambda_pos, k_neg, lambda_neg: Gamma shape (k) and rate (λ) per advantage sign.
  Returns:
    (loss_bt [B, T], PolicyLossDiagnostics) with ratio_bt = φ_i.
  """
  phi = vespo_weights(logp, old_logp, advantages, mask, k_pos=k_pos, lambda_pos=lambda_pos,
                      k_neg=k_neg, lambda_neg=lambda_neg)
  adv = advantages_bt(advantages, mask)
  log_r = token_log_ratio(logp, old_logp, mask)
  loss = -phi[:, None] * adv * zero_masked(logp.astype(jnp.float32), mask)
  return zero_masked(loss, mask), diagnostics(mask, jnp.broadcast_to(phi[:, None], mask.shape),
                                          log_r)
