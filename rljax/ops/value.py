"""Critic loss with value clipping, and explained variance."""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from rljax.ops.stats import masked_var, safe_divide


class ValueLossDiagnostics(NamedTuple):
  """Per-token diagnostics; average them with `aggregate(..., "token_mean")`.

  clipfrac_bt: 1 where the clipped branch is the larger (active) one (verl `vf_clipfrac`).
  error_bt: v − R (unclipped).
  """

  clipfrac_bt: jax.Array
  error_bt: jax.Array


def value_loss(values, old_values, returns, mask, *, clip_range):
  """Clipped value loss ½·max((v − R)², (clip(v, v_old − c, v_old + c) − R)²) per token.

  PPO value-function clipping: Schulman et al. 2017, "Proximal Policy
  Optimization Algorithms", arXiv:1707.06347 (the OpenAI baselines implementation, see
  Engstrom et al. 2020, arXiv:2005.12729, Sec. 3 "value function clipping"). The ½ factor
  follows verl/OpenRLHF (`compute_value_loss` in `verl/trainer/ppo/core_algos.py`); a
  form without it only rescales `vf_coef`.

  Args:
    values: current critic values v, float [B, T].
    old_values: values at rollout time v_old, float [B, T].
    returns: targets R (e.g. GAE returns), float [B, T].
    mask: [B, T].
    clip_range: c (verl/OpenRLHF 0.5, TRL/tunix 0.2); None disables clipping.
  Returns:
    (loss_bt float32 [B, T], 0 at masked positions; ValueLossDiagnostics).
  """
  chex.assert_rank(values, 2)
  chex.assert_equal_shape((values, old_values, returns, mask))
  valid = mask > 0
  v, v_old, ret = (jnp.where(valid, a, 0.0).astype(jnp.float32)
                   for a in (values, old_values, returns))
  loss_unclipped = jnp.square(v - ret)
  if clip_range is None:
    loss = loss_unclipped
    clipped = jnp.zeros_like(loss)
  else:
    v_clip = v_old + jnp.clip(v - v_old, -clip_range, clip_range)
    loss_clipped = jnp.square(v_clip - ret)
    loss = jnp.maximum(loss_unclipped, loss_clipped)
    clipped = (loss_clipped > loss_unclipped).astype(jnp.float32)
  zero = lambda x: jnp.where(valid, x, 0.0)  # noqa: E731
  return zero(0.5 * loss), ValueLossDiagnostics(zero(clipped), zero(v - ret))


def explained_variance(values, returns, mask, *, axis_name=None):
  """Explained variance of the critic, 1 − Var[R − v] / Var[R] over valid tokens.

  1 is a perfect critic, 0 no better than a constant, < 0 worse. This is verl's
  `critic/vf_explained_var` (`verl/trainer/ppo/metric_utils.py:compute_data_metrics`: the
  variances of the response tokens' returns and of returns − values), also the definition of
  scikit-learn's `explained_variance_score`. It differs from TRL's PPO `ppo/val/var_explained`,
  1 − E[(v − R)²] / Var[R], which counts a constant offset of the critic as unexplained.

  Note: the variances' ddof cancels in the ratio; verl divides by Var[R] + 1e-5, here Var[R]
  = 0 returns 0 (not a large negative number or NaN).

  Args:
    values: critic values v, float [B, T].
    returns: value targets R, float [B, T].
    mask: [B, T].
    axis_name: mapped axis for global variances, or None.
  Returns:
    scalar float32.
  """
  chex.assert_equal_shape((values, returns, mask))
  valid = mask > 0
  v = jnp.where(valid, values, 0.0).astype(jnp.float32)
  ret = jnp.where(valid, returns, 0.0).astype(jnp.float32)
  var_ret = masked_var(ret, mask, axis_name=axis_name)
  var_err = masked_var(ret - v, mask, axis_name=axis_name)
  return jnp.where(var_ret > 0, 1.0 - safe_divide(var_err, var_ret), 0.0)
