"""Reward shaping: DAPO soft overlong punishment (the paper's lengths), length penalty,
running moments, normalisation, clipping, reward whitening."""

import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tolerances import assert_close_f32

from rljax.ops import shaping

RNG = np.random.default_rng(0)
L_MAX, L_CACHE = 20480, 4096  # DAPO (arXiv:2503.14476): 16384 expected + a 4096-token cache


def np_dapo_penalty(length, max_len, cache_len):
  """DAPO Eq. 13, written directly."""
  if length <= max_len - cache_len:
    return 0.0
  if length <= max_len:
    return ((max_len - cache_len) - length) / cache_len
  return -1.0


def test_soft_overlong_seed_004_values():
  # DAPO Eq. 13: no penalty up to 16384 tokens, linear in the 4096-token buffer, −1 beyond 20480.
  lengths = [0, 1000, 16383, 16384, 16385, 17408, 18432, 19456, 20479, 20480, 20481, 30000]
  expected = [0, 0, 0, 0, -1 / 4096, -0.25, -0.5, -0.75, -4095 / 4096, -1.0, -1.0, -1.0]
  out = shaping.soft_overlong_penalty(jnp.array(lengths), max_len=L_MAX, cache_len=L_CACHE)
  np.testing.assert_allclose(out, expected, atol=1e-7)
  np.testing.assert_allclose(out, [np_dapo_penalty(n, L_MAX, L_CACHE) for n in lengths])


def test_soft_overlong_random_lengths_and_verl_form():
  lengths = RNG.integers(0, 25000, size=64)
  out = shaping.soft_overlong_penalty(lengths, max_len=L_MAX, cache_len=L_CACHE)
  assert_close_f32(out, [np_dapo_penalty(n, L_MAX, L_CACHE) for n in lengths],
                   ulps=16)   # float32 vs float64 division
  # verl's form (verl/workers/reward_manager/dapo.py): min(−(L − (L_max − L_buf))/L_buf, 0),
  # equal for L ≤ L_max (verl truncates generation at L_max, so longer lengths never reach it).
  inside = lengths <= L_MAX
  verl = np.minimum(-(lengths - (L_MAX - L_CACHE)) / L_CACHE, 0.0)
  assert_close_f32(np.asarray(out)[inside], verl[inside], ulps=16)
  with pytest.raises(ValueError):
    shaping.soft_overlong_penalty(lengths, max_len=10, cache_len=20)


def test_length_penalty_kimi():
  lengths = np.array([[10, 20, 30, 20], [5, 5, 5, 5]], np.float32)
  correct = np.array([[1, 1, 0, 0], [1, 0, 1, 0]])
  out = shaping.length_penalty(lengths, correct, coef=1.0)
  # λ = 0.5 − (len − 10)/20 = (0.5, 0, −0.5, 0); wrong answers get min(0, λ).
  np.testing.assert_allclose(out, [[0.5, 0.0, -0.5, 0.0], [0, 0, 0, 0]], atol=1e-6)
  masked = shaping.length_penalty(lengths, correct, coef=2.0,
                                  mask_bg=np.array([[1, 1, 0, 1], [0, 0, 0, 0]]))
  # without the 30-token sample: λ = 0.5 − (len − 10)/10 → (0.5, −0.5, ·, −0.5)
  np.testing.assert_allclose(masked, [[1.0, -1.0, 0.0, -1.0], [0, 0, 0, 0]], atol=1e-6)


def test_running_moments_equal_full_batch_moments():
  xs = [RNG.normal(3.0, 2.0, size=n).astype(np.float32) for n in (5, 1, 17, 8)]
  ms = [(RNG.random(x.shape) > 0.2).astype(np.float32) for x in xs]
  state = shaping.RunningMoments.create()
  update = jax.jit(lambda s, x, m: s.update(x, m))
  for x, m in zip(xs, ms):
    state = update(state, x, m)
  allv = np.concatenate([x[m > 0] for x, m in zip(xs, ms)])
  np.testing.assert_allclose(state.mean, allv.mean(), rtol=1e-5)
  np.testing.assert_allclose(state.var, allv.var(), rtol=1e-4)
  assert float(state.count) == allv.size
  empty = state.update(np.ones(3, np.float32), np.zeros(3))  # empty batch changes nothing
  np.testing.assert_allclose(jnp.stack(empty), jnp.stack(state))
  fresh = shaping.RunningMoments.create().update(np.ones(3, np.float32), np.zeros(3))
  assert np.all(np.isfinite(np.asarray(jnp.stack(fresh))))


def test_normalize_and_clip_rewards():
  state = shaping.RunningMoments.create().update(jnp.array([1.0, 3.0]), jnp.ones(2))
  r = jnp.array([1.0, 3.0, 5.0])
  np.testing.assert_allclose(shaping.normalize_rewards(r, state), [-1.0, 1.0, 3.0], atol=1e-6)
  np.testing.assert_allclose(shaping.normalize_rewards(r, state, shift_mean=False),
                             [1.0, 3.0, 5.0], atol=1e-6)
  np.testing.assert_allclose(shaping.clip_rewards(jnp.array([-9.0, 0.5, 9.0]), clip=5.0),
                             [-5.0, 0.5, 5.0])


def test_whiten_rewards_keeps_mean_unit_variance():
  r = RNG.normal(4.0, 3.0, size=(3, 5)).astype(np.float32)
  m = (RNG.random((3, 5)) > 0.3).astype(np.float32)
  out = np.asarray(shaping.whiten_rewards(r, m))
  sel = m > 0
  ref = (r - r[sel].mean()) / np.sqrt(r[sel].var() + 1e-8) + r[sel].mean()  # arXiv:1909.08593 code
  assert_close_f32(out[sel], ref[sel], ulps=64)   # masked mean/var vs NumPy's
  assert np.all(out[~sel] == 0)


_moments = jax.jit(lambda x, m: shaping.RunningMoments.create().update(x, m))
_kimi = jax.jit(lambda n, c, m: shaping.length_penalty(n, c, mask_bg=m))
_wr = jax.jit(shaping.whiten_rewards)


@given(x=hnp.arrays(np.float32, (3, 4), elements=st.floats(0, 100, width=32)),
       m=hnp.arrays(np.bool_, (3, 4)),
       junk=hnp.arrays(np.float32, (3, 4), elements=st.floats(width=32)))
def test_masked_positions_never_change_outputs(x, m, junk):
  dirty = np.where(m, x, junk)
  correct = x > 50
  pairs = [(_moments(x, m), _moments(dirty, m)), (_wr(x, m), _wr(dirty, m)),
           (_kimi(x, correct, m), _kimi(np.where(m, x, np.abs(junk)), correct | ~m, m))]
  for clean, other in pairs:
    for a, b in zip(jax.tree.leaves(clean), jax.tree.leaves(other)):
      np.testing.assert_array_equal(a, b)
      assert np.all(np.isfinite(a))
