"""Importance ratios: token, GSPO sequence (arXiv:2507.18071 Eq. 7), GSPO-token (§4.3)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tolerances import assert_close_f32

from rljax.ops.ratios import (
    LOG_RATIO_CLAMP,
    gspo_token_log_ratio,
    sequence_log_ratio,
    token_log_ratio,
)

MASK = np.array([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0]], np.float32)


def _inputs(seed=0):
  rng = np.random.default_rng(seed)
  logp = rng.uniform(-3.0, -0.1, MASK.shape).astype(np.float32)
  old_logp = (logp + rng.normal(0.0, 0.3, MASK.shape)).astype(np.float32)
  return logp, old_logp


def np_sequence_log_ratio(logp, old_logp, mask):
  """GSPO Eq. 7 in log space: (1/|y_i|) Σ_t log(π_θ/π_old), 0 for an empty row."""
  out = np.zeros(mask.shape[0])
  for i in range(mask.shape[0]):
    idx = mask[i] > 0
    if idx.any():
      out[i] = np.mean(logp[i, idx] - old_logp[i, idx])
  return out


def test_token_log_ratio_matches_difference_and_zero_at_mask():
  logp, old_logp = _inputs()
  got = np.asarray(token_log_ratio(logp, old_logp, MASK))
  np.testing.assert_allclose(got, (logp - old_logp) * MASK, rtol=1e-6, atol=1e-7)


def test_token_log_ratio_clamp_value_and_gradient():
  logp = jnp.array([[-0.1, -0.1, -30.0]])
  old_logp = jnp.array([[-30.0, -0.2, -0.1]])
  mask = jnp.ones((1, 3))
  got = token_log_ratio(logp, old_logp, mask)
  np.testing.assert_allclose(got, [[LOG_RATIO_CLAMP, 0.1, -LOG_RATIO_CLAMP]], rtol=1e-6)
  grad = jax.grad(lambda lp: jnp.sum(token_log_ratio(lp, old_logp, mask)))(logp)
  np.testing.assert_allclose(grad, [[0.0, 1.0, 0.0]])  # clamped tokens get no gradient


def test_sequence_log_ratio_matches_numpy_reference():
  logp, old_logp = _inputs(1)
  got = np.asarray(sequence_log_ratio(logp, old_logp, MASK))
  # a mean of signed log-ratios can be ~0: the bound scales with the largest |log-ratio|
  assert_close_f32(got, np_sequence_log_ratio(logp, old_logp, MASK), ulps=16,
                   scale=np.abs(logp - old_logp).max())
  assert got[-1] == 0.0  # fully masked row: s = 1


def test_sequence_log_ratio_seed003_two_token_example():
  # GSPO Eq. 7 on two tokens with ratios 2.0 and 0.4: s = exp((ln 2 + ln 0.4)/2) = sqrt(0.8).
  logp = jnp.log(jnp.array([[2.0, 0.4]]))
  s = jnp.exp(sequence_log_ratio(logp, jnp.zeros((1, 2)), jnp.ones((1, 2))))
  np.testing.assert_allclose(s, [np.sqrt(0.8)], rtol=1e-6)
  np.testing.assert_allclose(s, [0.894], atol=5e-4)


def test_sequence_log_ratio_clamps_the_mean_not_each_token():
  # One token at +30, one at -30: the mean is 0 (no per-token clamp changes it) ...
  logp = jnp.array([[30.0, -30.0], [40.0, 40.0]])
  got = sequence_log_ratio(logp, jnp.zeros((2, 2)), jnp.ones((2, 2)))
  np.testing.assert_allclose(got, [0.0, LOG_RATIO_CLAMP])  # ... and the mean is clamped


def test_sequence_log_ratio_gradient_is_mask_over_length():
  logp, old_logp = _inputs(2)
  w = np.array([1.0, -2.0, 0.5, 3.0], np.float32)
  grad = jax.grad(lambda lp: jnp.sum(w * sequence_log_ratio(lp, old_logp, MASK)))(logp)
  lengths = MASK.sum(-1, keepdims=True)
  expected = w[:, None] * MASK / np.maximum(lengths, 1)
  np.testing.assert_allclose(grad, expected, rtol=1e-6)


def test_gspo_token_value_is_sequence_ratio_and_gradient_is_per_token():
  logp, old_logp = _inputs(3)
  got = gspo_token_log_ratio(logp, old_logp, MASK)
  seq = np_sequence_log_ratio(logp, old_logp, MASK)
  assert_close_f32(got, seq[:, None] * MASK, ulps=16, scale=np.abs(logp - old_logp).max())
  w = np.random.default_rng(4).normal(size=MASK.shape).astype(np.float32)
  f = lambda lp, olp: jnp.sum(w * gspo_token_log_ratio(lp, olp, MASK))
  g_logp, g_old = jax.grad(f, argnums=(0, 1))(logp, old_logp)
  np.testing.assert_allclose(g_logp, w * MASK)  # ∂/∂logπ_t of token t only
  np.testing.assert_array_equal(g_old, np.zeros_like(g_old))  # sg(log s_i) stops old_logp


def test_masked_positions_are_ignored_even_when_huge():
  logp, old_logp = _inputs(5)
  bad_logp = np.where(MASK > 0, logp, 3e38).astype(np.float32)
  bad_old = np.where(MASK > 0, old_logp, -3e38).astype(np.float32)
  for fn in (token_log_ratio, sequence_log_ratio, gspo_token_log_ratio):
    np.testing.assert_array_equal(fn(logp, old_logp, MASK), fn(bad_logp, bad_old, MASK))
    grad = jax.grad(lambda lp, fn=fn: jnp.sum(fn(lp, bad_old, MASK)))(bad_logp)
    assert np.all(np.isfinite(grad)) and np.all(np.asarray(grad)[MASK == 0] == 0)


@pytest.mark.parametrize("fn", [token_log_ratio, sequence_log_ratio, gspo_token_log_ratio])
def test_ratios_under_jit(fn):
  logp, old_logp = _inputs(6)
  # jit fuses what eager runs op by op; signed means: bound from the largest |log-ratio|
  assert_close_f32(jax.jit(fn)(logp, old_logp, MASK), fn(logp, old_logp, MASK), ulps=16,
                   scale=np.abs(logp - old_logp).max())
