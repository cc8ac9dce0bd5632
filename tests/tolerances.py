"""Tolerances for float32 comparisons whose two sides round differently.

Two float32 computations of one quantity that add in different orders (a cached vs a full
forward, a sharded vs an unsharded reduction, another fusion, JAX vs a float64 NumPy or torch
reference) differ by rounding. Each operation is correctly rounded to within eps32/2, so a
sum of n terms of magnitude up to M can be off by up to about n·eps32·M (Higham, "Accuracy
and Stability of Numerical Algorithms", 2nd ed., §4.2): the error scales with the magnitude
of the values, not with an absolute constant. The summation order also changes with the
CPU: XLA vectorises reductions to the machine's SIMD width, so one program rounds
differently with AVX-512 and with AVX2 (`XLA_FLAGS=--xla_cpu_max_isa=AVX2` shows it).

So a comparison of two different programs states its bound in units of eps32 × the values'
magnitude, with the factor and its reason at the call, e.g.

  assert_close_f32(cached, full, ulps=256)   # cached vs full forward: other matmul splits

A mean that can cancel to ~0 (a loss over signed advantages, a mean log-prob gap) keeps the
rounding of its terms: its scale is the largest term (`scale=`, or 1 for normalised
advantages), never the mean itself.

The factors used in tests/ (on this suite no comparison used more than a tenth of its bound
with XLA's AVX-512, AVX2 or SSE4.2 code), still far below what a real bug moves:

  16   an elementwise formula, or a reduction over a handful of terms, vs float64 NumPy;
  64   a recursion or reduction over tens of terms, a mean/std normalisation, a gradient;
  256  a model forward (matmuls, attention, softmax) computed by two programs: logits,
       log-probs, values; with max|logit| ≈ 4 that is ≈ 1e-4, a wrong position, mask or
       weight moves logits by 1e-2 or more.

A comparison of one program with itself (determinism, resume, one jitted function on the
same inputs) stays exact, and hand-computed golden values keep their tight bounds.
"""

import numpy as np

EPS32 = float(np.finfo(np.float32).eps)   # 2**-23 ≈ 1.19e-7


def f32_atol(*values, ulps):
  """ulps · eps32 · max|values|: an absolute tolerance from the largest magnitude involved.

  Args:
    *values: arrays (or scalars) whose largest magnitude sets the scale, usually the
      reference and sometimes the intermediates (the logits behind a log-prob).
    ulps: the number of float32 epsilons of that scale the two sides may differ by.
  Returns:
    the tolerance, a Python float (0 when every value is 0).
  """
  scale = max(float(np.max(np.abs(np.asarray(v, np.float64)), initial=0.0)) for v in values)
  return ulps * EPS32 * scale


def assert_close_f32(actual, desired, *, ulps, scale=None, err_msg=""):
  """Asserts |actual − desired| ≤ ulps · eps32 · scale, elementwise.

  Args:
    actual, desired: arrays of one shape (or broadcastable), compared in float64.
    ulps: the bound in float32 epsilons of `scale`.
    scale: the magnitude the rounding errors are relative to; max|desired| when None. Pass
      the intermediates' magnitude when it exceeds the result's (a mean of signed terms, a
      log-prob from logits).
    err_msg: forwarded to the failure message.
  """
  atol = f32_atol(desired if scale is None else scale, ulps=ulps)
  np.testing.assert_allclose(np.asarray(actual, np.float64), np.asarray(desired, np.float64),
                             rtol=0, atol=atol, err_msg=err_msg)
