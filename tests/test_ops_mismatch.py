"""Train–inference mismatch correction: TIS, IcePop, sequence masks, OPSM, diagnostics."""

import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tolerances import assert_close_f32

from rljax.ops import mismatch

RNG = np.random.default_rng(0)
B, T = 4, 6


def _data():
  lt = np.log(RNG.uniform(0.05, 1.0, size=(B, T))).astype(np.float32)
  ls = (lt + RNG.normal(0.0, 0.5, size=(B, T))).astype(np.float32)
  m = np.ones((B, T), np.float32)
  m[1, 4:] = 0
  m[3] = 0  # empty row
  return lt, ls, m


def np_seq_log_ratio(lt, ls, m, level):
  d = np.where(m > 0, lt - ls, 0.0)
  if level == "token":
    return d
  s = d.sum(-1, keepdims=True)
  if level == "geometric":
    s = s / np.maximum(m.sum(-1, keepdims=True), 1)
  return np.broadcast_to(s, d.shape)


@pytest.mark.parametrize("level", ["token", "sequence", "geometric"])
def test_truncated_is_weights(level):
  lt, ls, m = _data()
  w = np.exp(np.clip(np_seq_log_ratio(lt, ls, m, level), -20, 20))
  ref = np.where(m > 0, np.minimum(w, 2.0), 0.0)
  np.testing.assert_allclose(mismatch.truncated_is_weights(lt, ls, m, cap=2.0, level=level),
                             ref, rtol=1e-5)


@pytest.mark.parametrize("level", ["token", "sequence", "geometric"])
def test_icepop_weights(level):
  lt, ls, m = _data()
  w = np.exp(np_seq_log_ratio(lt, ls, m, level))
  ref = np.where((m > 0) & (w >= 0.5) & (w <= 2.0), w, 0.0)
  np.testing.assert_allclose(mismatch.icepop_weights(lt, ls, m, low=0.5, high=2.0, level=level),
                             ref, rtol=1e-5)


def test_trl_sequence_mask_example():
  # huggingface/trl#4772: a per-token gap of 0.012 over 100 tokens → ratio e^1.2 ≈ 3.32 > 3.
  lt = jnp.full((2, 100), -1.0)
  ls = lt - jnp.array([[0.012], [0.010]])
  w = mismatch.icepop_weights(lt, ls, jnp.ones((2, 100)), low=0.0, high=3.0, level="sequence")
  assert float(w[0].max()) == 0.0
  np.testing.assert_allclose(w[1], np.exp(1.0), rtol=1e-4)
  keep = mismatch.sequence_mask(lt, ls, jnp.ones((2, 100)), low=0.0, high=3.0, level="sequence")
  np.testing.assert_array_equal(keep, [0.0, 1.0])


def test_sequence_mask_geometric_and_empty_row():
  lt, ls, m = _data()
  geo = np.exp(np_seq_log_ratio(lt, ls, m, "geometric")[:, 0])
  ref = ((geo >= 0.8) & (geo <= 1.25) & (m.sum(-1) > 0)).astype(np.float32)
  np.testing.assert_array_equal(mismatch.sequence_mask(lt, ls, m, low=0.8, high=1.25), ref)
  assert float(mismatch.sequence_mask(lt, ls, m, low=0.0, high=1e9)[3]) == 0.0
  with pytest.raises(ValueError):
    mismatch.sequence_mask(lt, ls, m, low=0.8, high=1.25, level="token")


def test_off_policy_sequence_mask():
  lp = jnp.zeros((3, 4))
  ls = jnp.array([[0.5] * 4, [0.5] * 4, [0.05] * 4])  # mean gap logπ_s − logπ_θ
  a = jnp.array([1.0, -1.0, -1.0])
  keep = mismatch.off_policy_sequence_mask(lp, ls, a, jnp.ones((3, 4)), delta=0.1)
  np.testing.assert_array_equal(keep, [1.0, 0.0, 1.0])  # positive kept; far negative dropped


def test_weights_carry_no_gradient_and_are_clamped():
  lt, ls, m = _data()
  g = jax.grad(lambda lt: mismatch.truncated_is_weights(lt, ls, m).sum())(lt)
  assert np.all(np.asarray(g) == 0)
  huge = mismatch.mismatch_log_ratio(lt + 100.0, ls, m, level="sequence")
  assert float(jnp.max(huge)) == mismatch.LOG_RATIO_CLAMP


def test_mismatch_diagnostics_match_numpy():
  lt, ls, m = _data()
  sel = m > 0
  d = (lt - ls)[sel]
  w = np.exp(d)
  seq_w = np.exp(np.where(sel, lt - ls, 0).sum(-1))[m.sum(-1) > 0]
  diag = mismatch.mismatch_diagnostics(lt, ls, m)
  # means of signed gaps (and of w − 1 − d, which cancels) can be ~0: bounds from the terms
  assert_close_f32(diag.logp_gap_mean, d.mean(), ulps=64, scale=np.abs(d).max())
  np.testing.assert_allclose(diag.logp_gap_abs_mean, np.abs(d).mean(), rtol=1e-5)
  np.testing.assert_allclose(diag.logp_gap_abs_max, np.abs(d).max(), rtol=1e-5)
  assert_close_f32(diag.kl_k1, -d.mean(), ulps=64, scale=np.abs(d).max())
  assert_close_f32(diag.kl_k3, (w - 1 - d).mean(), ulps=64, scale=w.max())
  np.testing.assert_allclose(diag.ess_token, w.sum() ** 2 / (w.size * (w**2).sum()), rtol=1e-5)
  np.testing.assert_allclose(diag.ess_seq, seq_w.sum() ** 2 / (seq_w.size * (seq_w**2).sum()),
                             rtol=1e-4)
  same = mismatch.mismatch_diagnostics(lt, lt, m)  # no mismatch: gaps 0, KL 0, ESS 1
  np.testing.assert_allclose([same.kl_k1, same.kl_k3, same.logp_gap_abs_max], 0.0, atol=1e-7)
  np.testing.assert_allclose([same.ess_token, same.ess_seq], 1.0, rtol=1e-6)
  empty = mismatch.mismatch_diagnostics(lt, ls, np.zeros_like(m))
  assert all(float(x) == 0.0 for x in empty)


_fns = {
    "tis": jax.jit(lambda a, b, m: mismatch.truncated_is_weights(a, b, m, level="sequence")),
    "ice": jax.jit(lambda a, b, m: mismatch.icepop_weights(a, b, m, level="geometric")),
    "seq": jax.jit(lambda a, b, m: mismatch.sequence_mask(a, b, m, low=0.5, high=2.0)),
    "diag": jax.jit(mismatch.mismatch_diagnostics),
    "opsm": jax.jit(lambda a, b, m: mismatch.off_policy_sequence_mask(
        a, b, jnp.array([1.0, -1.0, -1.0]), m, delta=0.5)),
}


@given(lt=hnp.arrays(np.float32, (3, 5), elements=st.floats(-8, 0, width=32)),
       ls=hnp.arrays(np.float32, (3, 5), elements=st.floats(-8, 0, width=32)),
       m=hnp.arrays(np.bool_, (3, 5)),
       junk=hnp.arrays(np.float32, (3, 5), elements=st.floats(width=32)))
def test_masked_positions_never_change_outputs(lt, ls, m, junk):
  for fn in _fns.values():
    clean = fn(lt, ls, m)
    dirty = fn(np.where(m, lt, junk), np.where(m, ls, -junk), m)
    for a, b in zip(jax.tree.leaves(clean), jax.tree.leaves(dirty)):
      np.testing.assert_array_equal(a, b)
      assert np.all(np.isfinite(a))
