"""Pieces every policy loss shares: the diagnostics tuple and advantage/mask handling.

Kept apart from `policy_loss` so the loss families in `policy_loss_gated` can use them
without an import cycle (`policy_loss` registers those families).
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp


class PolicyLossDiagnostics(NamedTuple):
  """Per-token indicator/value arrays `[B, T]` (0 at masked positions; average them with
  `aggregate(x, mask, "token_mean")`) and a few scalars. No gradient flows through them.

  Attributes:
    clip_low_bt: A < 0 and the ratio is below the lower bound (lower clip active).
    clip_high_bt: A > 0 and the ratio is above the upper bound (upper clip active; with a
      ratio cap δ < 1 + ε_high the cap is the active bound instead). For CISPO: the IS
      weight was truncated from above (any sign of A).
    clip_dual_bt: A < 0 and the loss was bounded by the dual clip c·|A|.
    ratio_cap_bt: the ratio cap decided the token's loss. `policy_loss`: the cap δ of the
      unclipped branch changed the loss and made it flat in the ratio (A > 0 and ρ > δ
      with δ < 1 + ε_high; A < 0 and ρ > max(δ, 1 + ε_high), unless the dual clip binds).
      `dppo_loss`: the stop-gradient IS weight was truncated at C.
    cov_selected_bt: tokens picked by Clip-Cov (loss detached) or KL-Cov (KL added).
    ratio_bt: the ratio the loss used (the sequence ratio s_i broadcast for GSPO).
    approx_kl_bt: k3 estimate of KL(π_old‖π_θ) per token, (r − 1) − log r with the
      *token* ratio r (also for sequence-level losses); ≥ 0, unbiased.
    ratio_max: max of `ratio_bt` over unmasked tokens (0 if none).
    ratio_min: min of `ratio_bt` over unmasked tokens (0 if none).
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


def advantages_bt(advantages, mask):
  """Advantages as float32 [B, T] (broadcast from [B]), 0 at masked positions."""
  chex.assert_rank(mask, 2)
  chex.assert_rank(advantages, {1, 2})
  if advantages.ndim == 1:
    chex.assert_equal_shape_prefix((advantages, mask), 1)
    advantages = jnp.broadcast_to(advantages[:, None], mask.shape)
  chex.assert_equal_shape((advantages, mask))
  return jnp.where(mask > 0, advantages.astype(jnp.float32), 0.0)


def diagnostics(mask, ratio, log_r_token, **indicators):
  """Builds PolicyLossDiagnostics; missing indicators are zeros; masks everything."""
  keep = mask > 0
  as_bt = lambda x: jax.lax.stop_gradient(jnp.where(keep, x.astype(jnp.float32), 0.0))
  zeros = jnp.zeros(mask.shape, jnp.float32)
  fields = {k: as_bt(indicators.get(k, zeros)) for k in (
      "clip_low_bt", "clip_high_bt", "clip_dual_bt", "ratio_cap_bt", "cov_selected_bt")}
  ratio = jax.lax.stop_gradient(ratio)
  any_token = jnp.any(keep)
  return PolicyLossDiagnostics(
      **fields,
      ratio_bt=as_bt(ratio),
      approx_kl_bt=as_bt(jnp.expm1(log_r_token) - log_r_token),
      ratio_max=jnp.where(any_token, jnp.max(jnp.where(keep, ratio, -jnp.inf)), 0.0),
      ratio_min=jnp.where(any_token, jnp.min(jnp.where(keep, ratio, jnp.inf)), 0.0),
  )
