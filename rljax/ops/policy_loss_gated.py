"""Policy losses of the 2025–26 catalogue that act per token: soft gates and divergence masks,
and the registry of the whole catalogue.

SAPO (soft sigmoid gate), GPG (plain policy gradient), DPPO (trust region on the
probability, TV or binary KL) and DRO (quadratic log-ratio penalty) are here; the losses on
a sequence ratio, GMPO, LUSPO and VESPO, are in `rljax.ops.policy_loss_sequence`.
Same contract as `rljax.ops.policy_loss`: `fn(logp, old_logp, advantages, mask, **hyper)
-> (loss_bt [B, T], PolicyLossDiagnostics)`, a loss to minimise, 0 at masked positions,
registered by name (`GATED_LOSSES`) in `policy_loss.POLICY_LOSSES`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from rljax.ops.policy_loss_common import (
  PolicyLoss,
  advantages_bt,
  diagnostics,
  non_negative,
  positive,
  zero_masked,
)
from rljax.ops.policy_loss_sequence import (
  gmpo_loss,
  luspo_loss,
  vespo_loss,
  vespo_weights,  # noqa: F401 (its old home)
)
from rljax.ops.ratios import token_log_ratio

DPPO_DIVERGENCES = ("tv", "kl")


def sapo_loss(logp, old_logp, advantages, mask, *, tau_pos=1.0, tau_neg=1.05):
  """SAPO: a soft, temperature-controlled gate on the token ratio instead of a hard clip.

  L_t = −f_τ(r_t)·A_t,   f_τ(r) = (4/τ)·σ(τ(r − 1)),   τ = τ_pos if A_t > 0 else τ_neg
  ("Soft Adaptive Policy Optimization", arXiv:2511.20347, its gate f;
  verl `sapo`, TRL `loss_type="sapo"`, both with τ_pos = 1, τ_neg = 1.05).

  The gradient is w(r)·r·(−A)∇logπ with w = f'(r) = 4σ(1 − σ): 1 at r = 1 (on-policy
  tokens get exactly the PPO/REINFORCE gradient), decaying smoothly as r leaves 1, and
  faster for larger τ (τ → ∞: zero off r = 1, the limit of a hard clip with ε → 0;
  τ → 0: the unclipped IS gradient −r·A).

  Note: the paper aggregates with seq_mean_token_mean (so do verl and TRL). Tokens with
  A = 0 use τ_neg (verl/TRL convention); they contribute nothing anyway.

  Args:
    logp, old_logp: current / old log-probs of the sampled tokens, [B, T].
    advantages: [B] or [B, T].
    mask: completion mask, [B, T].
    tau_pos, tau_neg: gate temperatures (> 0) for A > 0 and A ≤ 0.
  Returns:
    (loss_bt [B, T], PolicyLossDiagnostics); `clip_high_bt` / `clip_low_bt` mark A > 0
    tokens with r > 1 and A < 0 tokens with r < 1 whose gate weight fell below 1/2.
  """
  for name, v in (("tau_pos", tau_pos), ("tau_neg", tau_neg)):
    if isinstance(v, int | float) and v <= 0:
      raise ValueError(f"SAPO {name} must be > 0, got {v}")
  adv = advantages_bt(advantages, mask)
  log_r = token_log_ratio(logp, old_logp, mask)
  ratio = jnp.exp(log_r)
  tau = jnp.where(adv > 0, tau_pos, tau_neg)
  gate = jax.nn.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
  sig = jax.nn.sigmoid(tau * (ratio - 1.0))
  damped = 4.0 * sig * (1.0 - sig) < 0.5
  diag = diagnostics(mask, ratio, log_r, clip_high_bt=(adv > 0) & (ratio > 1) & damped,
                     clip_low_bt=(adv < 0) & (ratio < 1) & damped)
  return zero_masked(-gate * adv, mask), diag


def gpg_loss(logp, old_logp, advantages, mask):
  """GPG: the plain policy gradient, L_t = −A_t·logπ_θ(y_t), no ratio, no clip.

  Chu et al. 2025, "GPG: A Simple and Strong Reinforcement Learning Baseline for Model
  Reasoning", arXiv:2504.02546, the GPG objective (verl `gpg`). GPG's other half is its advantage,
  `rljax.ops.advantages_group.gpg_advantages` (α-scaled group mean baseline).

  Note: identical to `reinforce_loss(importance_weight=False)`; registered under its own
  name so the experiment file reads as the paper does. Aggregate with "token_mean".

  Args:
    logp, old_logp: current / old log-probs, [B, T] (old only feeds the diagnostics).
    advantages: [B] or [B, T].
    mask: completion mask, [B, T].
  Returns:
    (loss_bt [B, T], PolicyLossDiagnostics).
  """
  adv = advantages_bt(advantages, mask)
  log_r = token_log_ratio(logp, old_logp, mask)
  loss = -adv * zero_masked(logp.astype(jnp.float32), mask)
  return zero_masked(loss, mask), diagnostics(mask, jnp.exp(log_r), log_r)


def binary_kl(p_old, p):
  """KL(Bern(p_old) ‖ Bern(p)) = p_old·log(p_old/p) + (1 − p_old)·log((1 − p_old)/(1 − p)).

  The 1e-8 inside the second log follows verl's `dppo_kl` (p → 1 stays finite).
  """
  return (p_old * (jnp.log(p_old) - jnp.log(p))
          + (1.0 - p_old) * jnp.log((1.0 - p_old + 1e-8) / (1.0 - p + 1e-8)))


def dppo_loss(logp, old_logp, advantages, mask, *, divergence="tv", delta_low=0.15,
              delta_high=0.15, ratio_cap=3.0):
  """DPPO: a trust region on the sampled token's probability, not on the ratio.

  L_t = −A_t·sg(min(r_t, C))·logπ_θ(y_t)·M_t, with the binary mask M_t (no gradient):
    "tv":  A > 0: π − π_old ≤ δ_high;      A ≤ 0: π − π_old ≥ −δ_low
    "kl":  A > 0: D ≤ δ_high or π ≤ π_old;  A ≤ 0: D ≤ δ_low or π ≥ π_old,
           D = KL(Bern(π_old) ‖ Bern(π)) (`binary_kl`)
  ("Rethinking the Trust Region in LLM Reinforcement Learning", arXiv:2602.04879,
  DPPO-Binary-TV / -Binary-KL; truncated IS weight C of its §5.4; verl
  `dppo_tv` / `dppo_kl`). A rare token moving from 1e-5 to 1e-3 has ratio 100 (PPO clips
  it) but changes the probability by 1e-3 (DPPO keeps it); a likely token moving 0.9 → 0.6
  is inside PPO's ratio range for A < 0 with ε = 0.4 but outside a TV region of 0.15.

  Note: the loss value depends on logπ; only the gradient sg(w)·A·∇logπ is meaningful
  (as for CISPO). `delta_*` defaults are illustrative; the verl recipe sets them per
  divergence. Aggregate with "token_mean". C: verl reads it from the actor's
  `clip_ratio_c`, the dual-clip constant, which `ActorConfig` and `actor.yaml` set to 3.0,
  so 3.0 is what verl runs with unless told otherwise (its in-code fallback of 20 applies
  only when the key is absent, which never happens with verl's own configs); the default
  here is that 3.0. verl's comment beside it recommends a large C (§5.4 of the paper: truncation
  biases the gradient), and its DPPO example script sets `clip_ratio_c=10000.0`, i.e. no
  truncation in practice: pass a large `ratio_cap` to reproduce that recipe.

  Args:
    logp, old_logp: current / old log-probs, [B, T].
    advantages: [B] or [B, T].
    mask: completion mask, [B, T].
    divergence: "tv" or "kl".
    delta_low, delta_high: divergence thresholds for A ≤ 0 / A > 0.
    ratio_cap: C ≥ 1, the truncation of the stop-gradient IS weight (verl's effective
      default 3.0; its DPPO example uses 1e4).
  Returns:
    (loss_bt [B, T], PolicyLossDiagnostics); clip_high_bt / clip_low_bt mark masked-out
    tokens with A > 0 / A < 0, ratio_cap_bt the truncated weights.
  """
  if divergence not in DPPO_DIVERGENCES:
    raise ValueError(f"Unknown DPPO divergence {divergence!r}; valid: {DPPO_DIVERGENCES}")
  adv = advantages_bt(advantages, mask)
  log_r = token_log_ratio(logp, old_logp, mask)
  ratio = jnp.exp(log_r)
  lp = jax.lax.stop_gradient(zero_masked(logp.astype(jnp.float32), mask))
  p, p_old = jnp.exp(lp), jnp.exp(zero_masked(old_logp.astype(jnp.float32), mask))
  if divergence == "tv":
    ok_pos, ok_neg = p - p_old <= delta_high, p - p_old >= -delta_low
  else:
    d = binary_kl(p_old, p)
    ok_pos, ok_neg = (d <= delta_high) | (p <= p_old), (d <= delta_low) | (p >= p_old)
  valid = jnp.where(adv > 0, ok_pos, ok_neg)
  weight = jax.lax.stop_gradient(jnp.minimum(ratio, ratio_cap))
  loss = -adv * weight * zero_masked(logp.astype(jnp.float32), mask) * valid
  diag = diagnostics(mask, ratio, log_r, clip_high_bt=(adv > 0) & ~valid,
                     clip_low_bt=(adv < 0) & ~valid, ratio_cap_bt=ratio > ratio_cap)
  return zero_masked(loss, mask), diag


def dro_loss(logp, old_logp, advantages, mask, *, beta=0.1):
  """DRO: policy gradient with a quadratic log-ratio penalty, L_t = −A_t·logπ + (β/2)·ℓ_t².

  ℓ_t = logπ_θ(y_t) − logπ_old(y_t). Gradient −(A_t − β·ℓ_t)∇logπ: the policy part of
  Direct Reward Optimization's regularised squared loss ½(r − V − β·log π/π_ref)²
  (Richemond et al. 2024, "Offline Regularised Reinforcement Learning for Large Language
  Models Alignment", arXiv:2405.19107, the DRO objective, with A = r − V), as verl
  `dro` uses it.

  Note: the paper's π_ref is π_old here (the penalty keeps the update near the sampler,
  as in verl); ℓ is not clamped (its square is the penalty). Aggregate with "token_mean".

  Args:
    logp, old_logp: current / old log-probs, [B, T].
    advantages: [B] or [B, T].
    mask: completion mask, [B, T].
    beta: β > 0, the penalty strength.
  Returns:
    (loss_bt [B, T], PolicyLossDiagnostics).
  """
  if isinstance(beta, int | float) and beta <= 0:
    raise ValueError(f"DRO beta must be > 0, got {beta}")
  adv = advantages_bt(advantages, mask)
  lp = zero_masked(logp.astype(jnp.float32), mask)
  ell = lp - zero_masked(old_logp.astype(jnp.float32), mask)
  log_r = token_log_ratio(logp, old_logp, mask)
  loss = -adv * lp + 0.5 * beta * jnp.square(ell)
  return zero_masked(loss, mask), diagnostics(mask, jnp.exp(log_r), log_r)


def _clip_kwargs(f):
  return dict(eps_low=float(f["eps_low"]), eps_high=float(f["eps_high"]))


def _dppo_entry(divergence):
  return PolicyLoss(
      functools.partial(dppo_loss, divergence=divergence),
      kwargs=lambda f: dict(delta_low=float(f["dppo_delta_low"]),
                            delta_high=float(f["dppo_delta_high"]),
                            ratio_cap=float(f["dppo_ratio_cap"])),
      fields={"dppo_delta_low": 0.15, "dppo_delta_high": 0.15, "dppo_ratio_cap": 3.0},
      check=lambda f: non_negative(f, "dppo_delta_low", "dppo_delta_high") + (
          [] if f["dppo_ratio_cap"] >= 1 else
          [f"algo.dppo_ratio_cap={f['dppo_ratio_cap']} must be >= 1"]))


def _luspo_check(f):
  if f["loss_agg"] == "seq_mean_token_sum":
    return []
  return [f"algo.policy_loss='luspo' weights each sequence by its length through "
          f"algo.loss_agg='seq_mean_token_sum' (got {f['loss_agg']!r})"]


_VESPO_FIELDS = {"vespo_k_pos": 2.0, "vespo_lambda_pos": 3.0, "vespo_k_neg": 3.0,
                 "vespo_lambda_neg": 2.0}

# Registered by name in `policy_loss.POLICY_LOSSES` (config: algo.policy_loss).
GATED_LOSSES = {
    "sapo": PolicyLoss(
        sapo_loss, kwargs=lambda f: dict(tau_pos=float(f["sapo_tau_pos"]),
                                         tau_neg=float(f["sapo_tau_neg"])),
        fields={"sapo_tau_pos": 1.0, "sapo_tau_neg": 1.05},
        check=lambda f: positive(f, "sapo_tau_pos", "sapo_tau_neg")),
    "geo_mean": PolicyLoss(gmpo_loss, kwargs=_clip_kwargs),
    "gpg": PolicyLoss(gpg_loss),
    "dppo_tv": _dppo_entry("tv"),
    "dppo_kl": _dppo_entry("kl"),
    "dro": PolicyLoss(dro_loss, kwargs=lambda f: dict(beta=float(f["dro_beta"])),
                      fields={"dro_beta": 0.1}, check=lambda f: positive(f, "dro_beta")),
    "luspo": PolicyLoss(luspo_loss, kwargs=_clip_kwargs, check=_luspo_check),
    "vespo": PolicyLoss(
        vespo_loss, kwargs=lambda f: {k.removeprefix("vespo_"): float(f[k]) for k in _VESPO_FIELDS},
        fields=_VESPO_FIELDS,
        check=lambda f: (non_negative(f, "vespo_k_pos", "vespo_k_neg")
                         + positive(f, "vespo_lambda_pos", "vespo_lambda_neg"))),
}
