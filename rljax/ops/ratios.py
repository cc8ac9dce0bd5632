"""Importance ratios between the current and the old (behaviour) policy.

Three log-ratios, all per-token arrays `[B, T]` or per-sequence `[B]` in float32:

- `token_log_ratio`:       log r_{i,t} = logπ_θ − logπ_old                     (PPO / GRPO / DAPO)
- `sequence_log_ratio`:    log s_i = (1/|y_i|) Σ_t m_{i,t}(logπ_θ − logπ_old)  (GSPO)
- `gspo_token_log_ratio`:  logπ_θ − sg(logπ_θ) + sg(log s_i)                   (GSPO-token)

Every function replaces the inputs at masked positions by 0 *before* any arithmetic, so
arbitrary (even huge) values there can neither change an output nor put a NaN into a
gradient, and it returns 0 at masked positions and for fully masked rows.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from rljax.ops.stats import masked_count, safe_divide

LOG_RATIO_CLAMP = 20.0
"""Bound on |log ratio| (exp(20) ≈ 4.9e8 is still finite in float32, as in verl)."""


def _masked_inputs(logp, old_logp, mask):
  """Float32 copies of logp and old_logp with masked positions set to 0."""
  chex.assert_rank(logp, 2)
  chex.assert_equal_shape((logp, old_logp, mask))
  keep = mask > 0
  logp = jnp.where(keep, logp.astype(jnp.float32), 0.0)
  old_logp = jnp.where(keep, old_logp.astype(jnp.float32), 0.0)
  return logp, old_logp, keep


def token_log_ratio(logp, old_logp, mask):
  """Per-token log importance ratio log r = logπ_θ(y_t) − logπ_old(y_t), clamped.

  The PPO ratio r_t(θ) = π_θ(a_t|s_t) / π_old(a_t|s_t) (Schulman et al. 2017, "Proximal
  Policy Optimization Algorithms", arXiv:1707.06347, Eq. 6), in log space.

  Note: the clamp to [−LOG_RATIO_CLAMP, LOG_RATIO_CLAMP] = [−20, 20] sits here, on the
  log-ratio before any `exp` (verl's `compute_policy_loss_vanilla` does the same). A token
  beyond the clamp gets zero gradient through the ratio; for any sensible clip range PPO
  has already clipped it.

  Args:
    logp: log-probabilities of the sampled tokens under the current policy, [B, T].
    old_logp: the same under the old (sampling) policy, [B, T].
    mask: 1 for completion tokens, 0 for padding, [B, T].
  Returns:
    log r, float32 [B, T]; 0 at masked positions.
  """
  logp, old_logp, keep = _masked_inputs(logp, old_logp, mask)
  log_r = jnp.clip(logp - old_logp, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
  return jnp.where(keep, log_r, 0.0)


def sequence_log_ratio(logp, old_logp, mask):
  """GSPO length-normalised sequence log-ratio log s_i.

  s_i(θ) = (π_θ(y_i|x) / π_old(y_i|x))^{1/|y_i|}
         = exp((1/|y_i|) Σ_t log(π_θ(y_{i,t}|x, y_{i,<t}) / π_old(y_{i,t}|x, y_{i,<t})))
  (Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv:2507.18071, Eq. 7), the
  geometric mean of the token ratios.

  Note: |y_i| = Σ_t m_{i,t}. The clamp to ±LOG_RATIO_CLAMP is applied once, to the
  length-normalised mean (not to the individual token terms), so the gradient is the
  paper's for every sequence whose mean log-ratio lies within ±20. A fully masked row has
  |y_i| = 0 and gets log s_i = 0 (s_i = 1), with zero gradient.

  Args:
    logp: current-policy log-probs of the sampled tokens, [B, T].
    old_logp: old-policy log-probs, [B, T].
    mask: completion mask, [B, T].
  Returns:
    log s, float32 [B].
  """
  logp, old_logp, _ = _masked_inputs(logp, old_logp, mask)
  length_b = masked_count(mask, axis=-1)
  log_s = safe_divide(jnp.sum(logp - old_logp, axis=-1), length_b)
  return jnp.clip(log_s, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def gspo_token_log_ratio(logp, old_logp, mask):
  """GSPO-token per-token log-ratio: value of the sequence ratio, gradient per token.

  s_{i,t}(θ) = sg[s_i(θ)] · π_θ(y_{i,t}) / sg[π_θ(y_{i,t})]
  (Zheng et al. 2025, arXiv:2507.18071, §4.3 "GSPO-token"), i.e. in log space
  log s_{i,t} = logπ_θ(y_{i,t}) − sg(logπ_θ(y_{i,t})) + sg(log s_i).

  Numerically log s_{i,t} = log s_i for every token of sequence i; its gradient is
  ∇logπ_θ(y_{i,t}) alone (nothing flows into other tokens, nor into `old_logp`). With a
  per-token advantage this lets each token carry its own advantage while sharing the
  sequence-level clip decision.

  Note: log s_i is clamped to ±LOG_RATIO_CLAMP (see `sequence_log_ratio`); verl clamps
  the per-token value at 10 from above only.

  Args:
    logp: current-policy log-probs, [B, T].
    old_logp: old-policy log-probs, [B, T].
    mask: completion mask, [B, T].
  Returns:
    float32 [B, T]; 0 at masked positions.
  """
  log_s_b = jax.lax.stop_gradient(sequence_log_ratio(logp, old_logp, mask))
  logp, _, keep = _masked_inputs(logp, old_logp, mask)
  log_r = logp - jax.lax.stop_gradient(logp) + log_s_b[:, None]
  return jnp.where(keep, log_r, 0.0)
