"""Off-policy correction for asynchronous RL: the decoupled PPO objective and mismatch
metrics per staleness level.

With asynchronous rollouts the sampler generates with weights up to k versions older
than the trainer's (bounded staleness k; k = 0 is the synchronous loop). Three policies
then meet in one token's loss:

  π_behav  the version that sampled the token (the sampler's `Rollout.logp`); when a
           rollout spans a weight update, different tokens of one row have different
           behaviour versions, so everything here is per token.
  π_prox   the proximal policy: the trainer's policy before this update, i.e. the
           recomputed old log-probs (`old_logp`).
  π_θ      the policy being optimised.

Every function returns 0 at masked positions; weights are under `stop_gradient`.
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from rljax.ops.mismatch import LEVELS, mismatch_log_ratio
from rljax.ops.policy_loss import policy_loss
from rljax.ops.stats import masked_mean, safe_divide

BEHAV_CAP_MODES = ("mask", "truncate")


class DecoupledPPODiagnostics(NamedTuple):
  """`PolicyLossDiagnostics` (same nine fields, same order, same meaning, with π_prox as
  the old policy: `ratio_bt` is u = π_θ/π_prox), plus the behaviour weight. Per-token
  arrays are `[B, T]`, 0 at masked positions; no gradient flows through any field.

  Attributes:
    clip_low_bt, clip_high_bt, clip_dual_bt, ratio_cap_bt, cov_selected_bt, ratio_bt,
    approx_kl_bt, ratio_max, ratio_min: as in `rljax.ops.policy_loss.PolicyLossDiagnostics`,
      computed for every valid token, also for tokens the behaviour cap rejected.
    behav_weight_bt: the weight w = π_prox/π_behav the loss used (after the cap).
    behav_capped_bt: 1 where the uncapped weight exceeded the cap (rejected in "mask"
      mode, truncated in "truncate" mode).
    behav_approx_kl_bt: k3 estimate of KL(π_behav‖π_prox) per token, w − 1 − log w with
      the uncapped token weight (tokens are drawn from π_behav); ≥ 0.
  """

  clip_low_bt: jax.Array
  clip_high_bt: jax.Array
  clip_dual_bt: jax.Array
  ratio_cap_bt: jax.Array
  cov_selected_bt: jax.Array
  ratio_bt: jax.Array
  approx_kl_bt: jax.Array
  ratio_max: jax.Array
  ratio_min: jax.Array
  behav_weight_bt: jax.Array
  behav_capped_bt: jax.Array
  behav_approx_kl_bt: jax.Array


def _check_cap(cap, cap_mode):
  if cap_mode not in BEHAV_CAP_MODES:
    raise ValueError(f"Unknown behaviour-weight cap mode {cap_mode!r}; valid: {BEHAV_CAP_MODES}")
  if isinstance(cap, int | float) and cap < 1.0:
    raise ValueError(f"the behaviour-weight cap must be >= 1 (on-policy tokens have w = 1), "
                     f"got {cap}")


def behaviour_weights(prox_logp, behav_logp, mask, *, cap=5.0, cap_mode="mask", level="token"):
  """Staleness importance weight w = π_prox/π_behav, capped, under stop-gradient.

  The weight that carries the decoupled PPO objective (Fu et al. 2025, "AReaL: A
  Large-Scale Asynchronous Reinforcement Learning System for Language Reasoning",
  arXiv:2505.24298, Eq. 5) from the behaviour policy's tokens to the proximal policy.
  The paper leaves it uncapped; AReaL's implementation bounds it:
    "mask"      w ← 0 where w > cap   (the token leaves the loss; AReaL `token_mask`, its
                                        former default, with cap 5)
    "truncate"  w ← min(w, cap)       (AReaL `token_truncate`)
  `level` picks w as in `rljax.ops.mismatch.mismatch_log_ratio`: "token" (AReaL's
  default), "geometric" (the per-sequence geometric mean of the token weights, AReaL's
  sequence level) or "sequence" (the product ratio).

  Note: log w is clamped to ±20 before exp (`rljax.ops.mismatch.LOG_RATIO_CLAMP`). A
  rejected token keeps its place in the loss normaliser (aggregate with the original
  `mask`), as AReaL divides by the token count before rejection.

  Args:
    prox_logp: proximal (recomputed old) log-probs of the sampled tokens, float [B, T].
    behav_logp: the sampler's log-probs of the same tokens, float [B, T].
    mask: completion mask, [B, T].
    cap: bound ≥ 1 on w, or None for the paper's uncapped weight.
    cap_mode: "mask" or "truncate".
    level: one of `rljax.ops.mismatch.LEVELS`.
  Returns:
    (weight float32 [B, T], capped bool [B, T], uncapped log w float32 [B, T]); all 0 or
    False at masked positions.
  """
  _check_cap(cap, cap_mode)
  if level not in LEVELS:
    raise ValueError(f"Unknown behaviour-weight level {level!r}; valid: {LEVELS}")
  valid = mask > 0
  log_w = mismatch_log_ratio(prox_logp, behav_logp, mask, level=level)
  w = jnp.exp(log_w)
  if cap is None:
    capped = jnp.zeros(mask.shape, bool)
  else:
    capped = valid & (w > cap)
    w = jnp.where(capped, 0.0 if cap_mode == "mask" else cap, w)
  return jnp.where(valid, w, 0.0), capped, log_w


def decoupled_ppo_loss(logp, prox_logp, behav_logp, advantages, mask, *, eps_low=0.2,
                       eps_high=0.2, dual_clip=None, ratio_level="token", behav_cap=5.0,
                       behav_cap_mode="mask", behav_level="token"):
  """Decoupled PPO: the behaviour policy only reweights, the proximal policy is the clip centre.

  Per token, with w = sg(π_prox/π_behav) and u = π_θ/π_prox:
    L = −w · min(u·A, clip(u, 1 − ε_low, 1 + ε_high)·A)
  i.e. the negated objective of Fu et al. 2025, "AReaL: A Large-Scale Asynchronous
  Reinforcement Learning System for Language Reasoning", arXiv:2505.24298, Eq. 5:
    J(θ) = E_{a_t∼π_behav}[Σ_t (π_prox/π_behav)·min(u_t(θ)Â_t, clip(u_t(θ), 1−ε, 1+ε)Â_t)].
  Standard PPO clips π_θ/π_behav, which pulls the update back towards a stale policy;
  here the trust region is centred on the recent π_prox and staleness is corrected by
  importance weighting alone. With π_behav = π_prox (synchronous rollouts, no
  train–inference gap) w = 1 and L is `rljax.ops.policy_loss.policy_loss`.

  The clipped term is `policy_loss(logp, prox_logp, ...)`, so DAPO's decoupled
  ε_low/ε_high, the dual clip (applied before the weight, as in AReaL) and GSPO's
  sequence ratio (`ratio_level`) carry over unchanged. w is `behaviour_weights`.

  Note: the paper's w is uncapped; the default here follows AReaL's implementation,
  which rejects tokens with w > 5 (`behav_cap_mode="mask"`; `behav_cap=None` gives the
  paper's objective). A rejected token contributes 0 but keeps its place in the
  normaliser: aggregate with the original `mask`. w is per token (AReaL's default), so a
  rollout whose tokens were sampled by different weight versions simply carries each
  token's own sampler log-prob in `behav_logp`. Gradient flows only through u (into `logp`, and into `prox_logp` as in
  `policy_loss`); w carries none.

  Args:
    logp: current-policy log-probs of the sampled tokens, [B, T].
    prox_logp: proximal-policy log-probs (the trainer's old log-probs), [B, T].
    behav_logp: behaviour-policy log-probs (the sampler's), [B, T].
    advantages: [B] (broadcast over tokens) or [B, T].
    mask: completion mask, [B, T].
    eps_low, eps_high: clip range around π_prox (ratio in [1 − ε_low, 1 + ε_high]).
    dual_clip: c > 1 bounding the loss of A < 0 tokens at c·|A| (before w), or None.
    ratio_level: u at "token", "sequence" or "sequence_token" level (`policy_loss`).
    behav_cap: cap ≥ 1 on w, or None (no cap).
    behav_cap_mode: "mask" (w > cap → 0) or "truncate" (w → min(w, cap)).
    behav_level: "token", "geometric" or "sequence" weight (`behaviour_weights`).
  Returns:
    (loss_bt float32 [B, T] with 0 at masked positions, DecoupledPPODiagnostics).
  """
  chex.assert_rank(logp, 2)
  chex.assert_equal_shape((logp, prox_logp, behav_logp, mask))
  loss_bt, diag = policy_loss(logp, prox_logp, advantages, mask, ratio_level=ratio_level,
                              eps_low=eps_low, eps_high=eps_high, dual_clip=dual_clip)
  weight, capped, log_w = behaviour_weights(prox_logp, behav_logp, mask, cap=behav_cap,
                                            cap_mode=behav_cap_mode, level=behav_level)
  if behav_level != "token":
    log_w = mismatch_log_ratio(prox_logp, behav_logp, mask)
  behav_kl = jnp.where(mask > 0, jnp.expm1(log_w) - log_w, 0.0)
  return weight * loss_bt, DecoupledPPODiagnostics(
      *diag, behav_weight_bt=weight, behav_capped_bt=capped.astype(jnp.float32),
      behav_approx_kl_bt=behav_kl)


class StalenessMetrics(NamedTuple):
  """Mismatch between trainer and sampler by staleness level. `[L]` arrays are indexed by
  the lag l = 0..max_lag (L = max_lag + 1); the last bucket also holds lags > max_lag.

  Attributes:
    token_count_l: valid tokens sampled l versions before the trainer's current one.
    token_share_l: token_count_l / Σ token_count_l (all 0 for an empty mask).
    logp_gap_abs_l: mean |log π_train − log π_behav| over those tokens (0 if none).
    is_weight_l: mean π_train/π_behav over those tokens (0 if none).
    lag_mean: mean lag over valid tokens (unclipped).
    lag_max: largest lag of a valid token (unclipped; 0 for an empty mask).
  """

  token_count_l: jax.Array
  token_share_l: jax.Array
  logp_gap_abs_l: jax.Array
  is_weight_l: jax.Array
  lag_mean: jax.Array
  lag_max: jax.Array


def staleness_metrics(version_lag, logp_train, logp_behav, mask, *, max_lag, axis_name=None):
  """Share of tokens, mean |log-prob gap| and mean importance weight per staleness lag.

  For each lag l = 0..max_lag (l = trainer version − version that sampled the token):
    share_l = N_l / N,   gap_l = (1/N_l) Σ_{lag=l} |log π_train − log π_behav|,
    weight_l = (1/N_l) Σ_{lag=l} π_train/π_behav
  over valid tokens. At lag 0 the gap is the pure train–inference mismatch (Yao et al.
  2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training",
  fengyao.notion.site/off-policy-rl); each further lag adds a version of policy drift,
  the staleness that AReaL's decoupled objective corrects (arXiv:2505.24298, Eq. 5).

  Note: lags are clipped into [0, max_lag] for the buckets (the last bucket collects any
  lag beyond the bound); `lag_mean` and `lag_max` use the unclipped lags, so an overflow
  stays visible. log π_train − log π_behav is clamped to ±20 as in `rljax.ops.mismatch`.

  Args:
    version_lag: integer lag per sequence [B] (broadcast over tokens) or per token [B, T].
    logp_train: the trainer's log-probs of the sampled tokens before the update (the
      proximal / recomputed old log-probs), float [B, T].
    logp_behav: the sampler's log-probs, float [B, T].
    mask: completion mask, [B, T].
    max_lag: the staleness bound k (a Python int ≥ 0; fixes the output length).
    axis_name: mapped axis to reduce over as well (global metrics across devices), or None.
  Returns:
    StalenessMetrics: four float32 [max_lag + 1] arrays and two float32 scalars.
  """
  if not isinstance(max_lag, int) or max_lag < 0:
    raise ValueError(f"max_lag must be a Python int >= 0, got {max_lag!r}")
  chex.assert_rank(mask, 2)
  chex.assert_rank(version_lag, {1, 2})
  if version_lag.ndim == 1:
    chex.assert_equal_shape_prefix((version_lag, mask), 1)
    version_lag = jnp.broadcast_to(version_lag[:, None], mask.shape)
  chex.assert_equal_shape((version_lag, logp_train, logp_behav, mask))
  psum = (lambda x: x) if axis_name is None else (lambda x: jax.lax.psum(x, axis_name))
  valid = mask > 0
  lag = jnp.where(valid, version_lag, 0).astype(jnp.int32)
  log_w = mismatch_log_ratio(logp_train, logp_behav, mask)
  in_bucket = (jnp.clip(lag, 0, max_lag)[..., None] == jnp.arange(max_lag + 1)) & valid[..., None]
  in_bucket = in_bucket.astype(jnp.float32)                          # [B, T, L]
  count_l = psum(jnp.sum(in_bucket, axis=(0, 1)))
  gap_l = psum(jnp.einsum("btl,bt->l", in_bucket, jnp.abs(log_w)))
  weight_l = psum(jnp.einsum("btl,bt->l", in_bucket, jnp.where(valid, jnp.exp(log_w), 0.0)))
  lag_max = jnp.max(lag).astype(jnp.float32)
  if axis_name is not None:
    lag_max = jax.lax.pmax(lag_max, axis_name)
  return StalenessMetrics(
      token_count_l=count_l,
      token_share_l=safe_divide(count_l, jnp.sum(count_l)),
      logp_gap_abs_l=safe_divide(gap_l, count_l),
      is_weight_l=safe_divide(weight_l, count_l),
      lag_mean=masked_mean(lag.astype(jnp.float32), mask, axis_name=axis_name),
      lag_max=lag_max,
  )
