"""Masked statistics shared by every kernel.

All reductions here are safe on fully masked inputs: a denominator of zero yields 0,
never NaN. `axis_name`, where accepted, makes the reduction global over the devices of
a `shard_map`/`pmap` axis (seed 001: normalise over the global batch, not per shard).
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp


def _psum(x, axis_name):
  return x if axis_name is None else jax.lax.psum(x, axis_name)


def masked_sum(x, mask, *, axis=None, axis_name=None):
  """Σ x·m over `axis` (all axes when None), summed over devices when `axis_name` is set."""
  chex.assert_equal_shape((x, mask))
  return _psum(jnp.sum(jnp.where(mask > 0, x, 0.0), axis=axis), axis_name)


def masked_count(mask, *, axis=None, axis_name=None):
  """Σ m over `axis`, summed over devices when `axis_name` is set."""
  return _psum(jnp.sum((mask > 0).astype(jnp.float32), axis=axis), axis_name)


def safe_divide(numerator, denominator):
  """numerator / denominator, and 0 where the denominator is 0 (no NaN, no inf)."""
  nonzero = denominator != 0
  return jnp.where(nonzero, numerator / jnp.where(nonzero, denominator, 1.0), 0.0)


def masked_mean(x, mask, *, axis=None, axis_name=None):
  """Mean of x over positions where mask is set; 0 for an empty mask.

  Args:
    x: values, any shape.
    mask: same shape as x; positions with mask > 0 count.
    axis: reduction axis (None: all).
    axis_name: mapped axis to reduce over as well (global mean across devices).
  Returns:
    the masked mean, shape of x with `axis` removed.
  """
  return safe_divide(
      masked_sum(x, mask, axis=axis, axis_name=axis_name),
      masked_count(mask, axis=axis, axis_name=axis_name),
  )


def masked_var(x, mask, *, axis=None, axis_name=None, ddof=0):
  """Masked variance Σ m(x−μ)² / (Σm − ddof); 0 when Σm ≤ ddof.

  Note: two-pass (mean first) for numerical stability; `ddof=1` gives the unbiased
  (Bessel) estimate used by GRPO implementations.
  """
  mean = masked_mean(x, mask, axis=axis, axis_name=axis_name)
  mean_b = mean if axis is None else jnp.expand_dims(mean, axis)
  sq = masked_sum(jnp.square(x - mean_b), mask, axis=axis, axis_name=axis_name)
  count = masked_count(mask, axis=axis, axis_name=axis_name)
  return jnp.where(count > ddof, safe_divide(sq, count - ddof), 0.0)


def masked_std(x, mask, *, axis=None, axis_name=None, ddof=0):
  """sqrt of `masked_var`; 0 for fewer than ddof + 1 valid entries."""
  return jnp.sqrt(masked_var(x, mask, axis=axis, axis_name=axis_name, ddof=ddof))
