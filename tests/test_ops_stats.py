"""Statistics: unbiased pass@k and the masked moments, against exact references."""

import itertools
import math
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tolerances import assert_close_f32

from rljax.ops import stats


def exact_pass_at_k(n, c, k):
  return float(1 - Fraction(math.comb(n - c, k), math.comb(n, k)))


def test_pass_at_k_small_exact():
  for n in (1, 2, 5, 10):
    for k in range(1, n + 1):
      c = np.arange(n + 1)
      ref = [exact_pass_at_k(n, ci, k) for ci in c]
      # 1 − a product of k rounded factors in [0, 1]: |error| ≲ (k + 1)·eps32 (k ≤ 10 here)
      assert_close_f32(stats.pass_at_k(n, c, k), ref, ulps=32, scale=1.0)


def test_pass_at_k_matches_subset_enumeration():
  # pass@k = probability that a uniformly random size-k subset holds a correct sample.
  n = 6
  for c in range(n + 1):
    correct = [1] * c + [0] * (n - c)
    for k in range(1, n + 1):
      subsets = list(itertools.combinations(range(n), k))
      ref = np.mean([max(correct[i] for i in s) for s in subsets])
      assert_close_f32(stats.pass_at_k(n, c, k), ref, ulps=32, scale=1.0)   # as above, k ≤ 6


def test_pass_at_1_is_c_over_n():
  c = np.arange(0, 1025, 7)
  np.testing.assert_allclose(stats.pass_at_k(1024, c, 1), c / 1024, rtol=1e-6)


@pytest.mark.parametrize("k", [2, 16, 100, 512, 1024])
def test_pass_at_k_stable_for_n_1024(k):
  n = 1024
  c = np.array([0, 1, 2, 10, 100, 500, 1000, 1023, 1024])
  ref = np.array([exact_pass_at_k(n, int(ci), k) for ci in c])
  out = np.asarray(stats.pass_at_k(n, c, k))
  assert np.all(np.isfinite(out))
  # 1 − a product of k rounded factors in [0, 1]: |error| ≲ (k + 1)·eps32 in the worst case
  # (a wrong factor moves pass@k by ≥ 1/n ≈ 1e-3)
  assert_close_f32(out, ref, ulps=2 * k + 16, scale=1.0)
  assert out[0] == 0.0 and out[-1] == 1.0


def test_pass_at_k_vectorised_over_n_c_k_and_jittable_in_c():
  n = np.array([4, 8, 16])
  c = np.array([1, 3, 0])
  k = np.array([2, 4, 1])
  ref = [exact_pass_at_k(int(a), int(b), int(d)) for a, b, d in zip(n, c, k)]
  # 1 − a product of k ≤ 4 rounded factors: |error| ≲ (k + 1)·eps32
  assert_close_f32(stats.pass_at_k(n, c, k), ref, ulps=32, scale=1.0)
  jitted = jax.jit(lambda c: stats.pass_at_k(16, c, 4))
  assert_close_f32(jitted(jnp.arange(17)), [exact_pass_at_k(16, i, 4) for i in range(17)],
                   ulps=32, scale=1.0)


def test_pass_at_k_rejects_bad_k():
  with pytest.raises(ValueError):
    stats.pass_at_k(4, 1, 5)
  with pytest.raises(ValueError):
    stats.pass_at_k(4, 1, 0)


def test_pass_at_k_from_correct():
  correct = jnp.array([[1, 0, 0, 0], [1, 1, 0, 1], [0, 0, 0, 0]])
  out = stats.pass_at_k_from_correct(correct, 2, mask_bg=jnp.array([[1, 1, 1, 1],
                                                                    [1, 1, 1, 0],
                                                                    [1, 0, 0, 0]]))
  # row 1 has n=3 valid, c=2; row 2 has fewer than k valid samples → 0.
  assert_close_f32(out, [exact_pass_at_k(4, 1, 2), exact_pass_at_k(3, 2, 2), 0.0], ulps=32,
                   scale=1.0)   # as above, k = 2


def test_comb_ratio():
  a = np.array([0, 3, 5, 9, -1])
  b = np.array([5, 5, 5, 9, 4])
  out = stats.comb_ratio(a, b, 3)
  ref = [0, math.comb(3, 3) / math.comb(5, 3), 1.0, 1.0, 0.0]
  np.testing.assert_allclose(out, ref, atol=1e-7)
  np.testing.assert_allclose(stats.comb_ratio(a, b, 0), np.ones(5))


def test_masked_moments_unchanged_and_safe():
  x = np.random.default_rng(1).normal(size=(3, 4)).astype(np.float32)
  m = np.array([[1, 1, 0, 1], [0, 0, 0, 0], [1, 0, 0, 0]], np.float32)
  # a mean of signed values can be ~0: the bound scales with the values
  assert_close_f32(stats.masked_mean(x, m), x[m > 0].mean(), ulps=16, scale=np.abs(x).max())
  np.testing.assert_allclose(stats.masked_var(x, m, ddof=1), x[m > 0].var(ddof=1), rtol=1e-5)
  row_std = stats.masked_std(x, m, axis=-1, ddof=1)
  np.testing.assert_allclose(row_std, [x[0, m[0] > 0].std(ddof=1), 0.0, 0.0], rtol=1e-5)
  assert float(stats.masked_mean(x, np.zeros_like(m))) == 0.0
