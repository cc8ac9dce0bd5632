"""Masked statistics shared by every kernel.

All reductions here are safe on fully masked inputs: a denominator of zero yields 0,
never NaN. `axis_name`, where accepted, makes the reduction global over the devices of
a `shard_map`/`pmap` axis: normalise over the global batch, not per shard
(`tests/test_ops_whiten_sharded.py`).
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np


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


def _static_max(x, name):
  """Largest value of a concrete int or array (a traced value needs an explicit bound)."""
  if isinstance(x, jax.core.Tracer):
    raise ValueError(f"{name} must be concrete (a Python int or NumPy array), not traced")
  return int(np.max(np.asarray(x)))


def comb_ratio(a, b, j, *, max_j=None):
  """C(a, j)/C(b, j) for integers 0 ≤ a ≤ b, in the product form Π_{i<j} (a − i)/(b − i).

  Each factor lies in [0, 1], so the product neither overflows nor loses the small
  values that a ratio of factorials (or of lgamma differences) would; it is exact 0 when
  a < j and exact 1 when a = b. Negative `a` counts as an empty pool (ratio 0 for j ≥ 1).

  Args:
    a, b: float or int arrays (broadcastable), the pool sizes.
    j: subset size, int or int array (broadcastable with a, b).
    max_j: static upper bound on j; taken from `j` when it is concrete.
  Returns:
    the ratio, float32, broadcast shape of (a, b, j); C(·, 0) ratios are 1.
  """
  max_j = _static_max(j, "j") if max_j is None else int(max_j)
  a, b, j = (jnp.asarray(v, jnp.float32)[..., None] for v in (a, b, j))
  i = jnp.arange(max_j, dtype=jnp.float32)
  terms = safe_divide(jnp.maximum(a - i, 0.0), b - i)
  ratio = jnp.prod(jnp.where(i < j, terms, 1.0), axis=-1)
  return jnp.where(a[..., 0] >= b[..., 0], 1.0, ratio)  # exact 1 (XLA may not divide exactly)


def pass_at_k(n, c, k):
  """Unbiased pass@k estimator 1 − C(n − c, k)/C(n, k).

  Chen et al. 2021, "Evaluating Large Language Models Trained on Code", arXiv:2107.03374,
  Eq. 1. Computed in a product form over k factors (Codex Fig. 3 uses the equivalent
  product over c factors),
  1 − Π_{i<k} (n − c − i)/(n − i) in float32; accurate for n up to a few thousand.

  Args:
    n: samples per problem, int or int array (broadcastable with c).
    c: correct samples per problem, int array, 0 ≤ c ≤ n (may be traced).
    k: 1 ≤ k ≤ n, int or int array; must be concrete (its maximum sizes the product).
  Returns:
    pass@k, float32, broadcast shape of (n, c, k). pass@k(n, c, 1) = c/n.
  Raises:
    ValueError: if k is traced, or k < 1 or k > n for concrete n.
  """
  k_max = _static_max(k, "k")
  if np.min(np.asarray(k)) < 1:
    raise ValueError(f"pass_at_k needs k >= 1, got {k}")
  if not isinstance(n, jax.core.Tracer) and np.any(np.asarray(k) > np.asarray(n)):
    raise ValueError(f"pass_at_k needs k <= n, got k={k}, n={n}")
  n = jnp.asarray(n, jnp.float32)
  c = jnp.asarray(c, jnp.float32)
  return 1.0 - comb_ratio(n - c, n, k, max_j=k_max)


def pass_at_k_from_correct(correct_bg, k, *, mask_bg=None):
  """pass@k per prompt from a [B, G] correctness array (n = valid samples, c = correct).

  Args:
    correct_bg: bool or {0, 1} [B, G].
    k: concrete int, 1 ≤ k ≤ G.
    mask_bg: optional [B, G] validity.
  Returns:
    pass@k, float32 [B]; 0 for a prompt with fewer than k valid samples.
  """
  chex.assert_rank(correct_bg, 2)
  valid = jnp.ones(correct_bg.shape, bool) if mask_bg is None else mask_bg > 0
  n = jnp.sum(valid, axis=-1).astype(jnp.float32)
  c = jnp.sum(valid & (correct_bg > 0), axis=-1).astype(jnp.float32)
  if k > correct_bg.shape[-1]:
    raise ValueError(f"k={k} exceeds the group size {correct_bg.shape[-1]}")
  value = 1.0 - comb_ratio(n - c, n, k)
  return jnp.where(n >= k, value, 0.0)
