"""Value loss with clipping, explained variance, entropy from logits (plain and chunked)."""

import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from tolerances import assert_close_f32

from rljax.ops import entropy as ent
from rljax.ops import value

RNG = np.random.default_rng(0)


# ---------- value loss ----------


def np_value_loss(v, v_old, ret, m, c):
  """Clipped value loss (arXiv:1707.06347; arXiv:2005.12729 §3) with the ½ of verl's
  `compute_value_loss` (verl/trainer/ppo/core_algos.py): 0.5·max((v−R)², (clip(v, v_old±c)−R)²)."""
  v_clip = np.clip(v, v_old - c, v_old + c)
  l1, l2 = (v - ret) ** 2, (v_clip - ret) ** 2
  return np.where(m > 0, 0.5 * np.maximum(l1, l2), 0.0), np.where(m > 0, l2 > l1, 0.0)


def test_value_loss_matches_reference():
  v, v_old, ret = (RNG.normal(size=(3, 6)).astype(np.float32) for _ in range(3))
  m = (RNG.random((3, 6)) > 0.3).astype(np.float32)
  loss, diag = value.value_loss(v, v_old, ret, m, clip_range=0.2)
  ref_loss, ref_frac = np_value_loss(v, v_old, ret, m, 0.2)
  assert_close_f32(loss, ref_loss, ulps=16)   # elementwise, JAX vs NumPy
  np.testing.assert_array_equal(diag.clipfrac_bt, ref_frac)
  assert_close_f32(diag.error_bt, np.where(m > 0, v - ret, 0), ulps=16)
  unclipped, _ = value.value_loss(v, v_old, ret, m, clip_range=None)
  assert_close_f32(unclipped, np.where(m > 0, 0.5 * (v - ret) ** 2, 0), ulps=16)


def test_value_loss_hand_values_and_gradient():
  # v_old = 0, c = 0.2, R = 1, so clip(v) = 0.2 for v ≥ 0.2 and (0.2 − R)² = 0.64.
  # v = 0.5: max(0.25, 0.64) → 0.32, clipped branch active, no gradient.
  # v = 1.5: max(0.25, 0.64) → 0.32, clipped branch active, no gradient.
  # v = −0.1 (inside the range): both branches equal, 0.5·1.1² = 0.605, gradient v − R.
  v = jnp.array([[0.5, 1.5, -0.1]])
  zeros, ret, m = jnp.zeros((1, 3)), jnp.ones((1, 3)), jnp.ones((1, 3))
  loss, diag = value.value_loss(v, zeros, ret, m, clip_range=0.2)
  np.testing.assert_allclose(loss, [[0.32, 0.32, 0.605]], atol=1e-6)
  np.testing.assert_array_equal(diag.clipfrac_bt, [[1, 1, 0]])
  grad = jax.grad(lambda v: value.value_loss(v, zeros, ret, m, clip_range=0.2)[0].sum())(v)
  np.testing.assert_allclose(grad, [[0.0, 0.0, -1.1]], atol=1e-6)


def test_explained_variance():
  ret = RNG.normal(size=(2, 5)).astype(np.float32)
  v = ret + 0.3 * RNG.normal(size=(2, 5)).astype(np.float32)
  m = np.ones((2, 5), np.float32)
  m[1, 3:] = 0
  sel = m > 0
  ref = 1 - np.var(ret[sel] - v[sel]) / np.var(ret[sel])
  np.testing.assert_allclose(value.explained_variance(v, ret, m), ref, rtol=1e-5)
  np.testing.assert_allclose(value.explained_variance(ret, ret, m), 1.0)
  assert float(value.explained_variance(v, np.ones_like(ret), m)) == 0.0  # Var[R] = 0
  assert float(value.explained_variance(v, ret, np.zeros_like(m))) == 0.0
  # verl's definition (variances, ddof=1 as torch.var): a constant offset of the critic is
  # explained; TRL's 1 − E[(v − R)²]/Var[R] would count it against the critic
  verl = 1 - np.var(ret[sel] - v[sel] - 2.0, ddof=1) / np.var(ret[sel], ddof=1)
  np.testing.assert_allclose(value.explained_variance(v + 2.0, ret, m), verl, rtol=1e-5)
  np.testing.assert_allclose(value.explained_variance(ret + 2.0, ret, m), 1.0, atol=1e-6)


# ---------- entropy ----------


def np_entropy(z):
  z = z.astype(np.float64)
  p = np.exp(z - z.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  return -(p * np.log(np.where(p > 0, p, 1.0))).sum(-1)


def test_entropy_from_logits_matches_definition():
  z = RNG.normal(scale=3.0, size=(2, 3, 11)).astype(np.float32)
  # softmax over V = 11 logits vs float64: rounding scales with the logits (|z| up to ~9)
  assert_close_f32(ent.entropy_from_logits(z), np_entropy(z), ulps=64, scale=np.abs(z).max())
  np.testing.assert_allclose(ent.entropy_from_logits(jnp.zeros((4, 50))), np.log(50.0) * np.ones(4),
                             rtol=1e-6)


def test_entropy_stable_for_extreme_and_bf16_logits():
  z = np.array([[1e4, 0.0, -1e4], [88.0, 88.0, -1e30]], np.float32)  # one-hot / two-way tie
  out = np.asarray(ent.entropy_from_logits(z))
  np.testing.assert_allclose(out, [0.0, np.log(2.0)], atol=1e-6)
  masked_vocab = np.array([[0.0, 0.0, -np.inf, -np.inf]], np.float32)  # top-k filtered
  np.testing.assert_allclose(ent.entropy_from_logits(masked_vocab), [np.log(2.0)], atol=1e-6)
  g = jax.grad(lambda z: ent.entropy_from_logits(z).sum())(jnp.asarray(z[:1]))
  assert np.all(np.isfinite(np.asarray(g)))
  zb = jnp.asarray(RNG.normal(size=(3, 17)), jnp.bfloat16)
  out_b = ent.entropy_from_logits(zb)
  assert out_b.dtype == jnp.float32
  z32 = np.asarray(zb.astype(jnp.float32))
  assert_close_f32(out_b, np_entropy(z32), ulps=64, scale=np.abs(z32).max())   # as above


def test_chunked_entropy_equals_full_with_lm_head_and_gradients():
  b, t, d, v = 2, 7, 4, 9  # T not a multiple of the chunk size
  h = jnp.asarray(RNG.normal(size=(b, t, d)), jnp.float32)
  w = jnp.asarray(RNG.normal(size=(d, v)), jnp.float32)

  def full(w):
    return ent.entropy_from_logits(h @ w)

  def chunked(w):
    return ent.chunked_entropy(h, lambda x: x @ w, chunk_size=3)

  # chunks vs one program: other matmul and softmax sums; rounding scales with the logits
  z_max = float(jnp.abs(h @ w).max())
  assert_close_f32(chunked(w), full(w), ulps=64, scale=z_max)
  g_full = jax.grad(lambda w: full(w).sum())(w)
  g_chunk = jax.grad(lambda w: chunked(w).sum())(w)
  assert_close_f32(g_chunk, g_full, ulps=64)   # a sum over B·T = 14 positions per weight
  logits = h @ w  # the "array chunked by lax.map" use: identity logits_fn
  assert_close_f32(ent.chunked_entropy(logits, lambda x: x, chunk_size=4), full(w), ulps=64,
                   scale=z_max)


def test_entropy_bonus_and_adaptive_coefficient():
  h = jnp.array([[1.0, 2.0, 3.0]])
  np.testing.assert_allclose(ent.entropy_bonus(h, jnp.array([[1, 1, 0]]), coef=0.01),
                             [[-0.01, -0.02, 0.0]])
  g = jax.grad(lambda h: ent.entropy_bonus(h, jnp.ones((1, 3)), coef=0.5).sum())(h)
  np.testing.assert_allclose(g, -0.5 * np.ones((1, 3)))
  c = ent.AdaptiveEntropyCoef(value=jnp.float32(0.0))
  for h_now in (0.1, 0.1, 0.3):  # up, up, down (H vs target 0.2; Skywork-OR1, arXiv:2505.22312)
    c = c.update(h_now)
  np.testing.assert_allclose(c.value, 0.005, atol=1e-7)
  assert float(c.coefficient(0.3)) == 0.0 and float(c.coefficient(0.1)) == float(c.value)
  c = ent.AdaptiveEntropyCoef(value=jnp.float32(0.0)).update(0.9)
  assert float(c.value) == 0.0  # clipped at min_value


# ---------- property: masked values never matter ----------

_vl = jax.jit(lambda v, vo, r, m: value.value_loss(v, vo, r, m, clip_range=0.2))
_ev = jax.jit(value.explained_variance)
_eb = jax.jit(lambda h, m: ent.entropy_bonus(h, m, coef=0.1))


@given(v=hnp.arrays(np.float32, (2, 4), elements=st.floats(-5, 5, width=32)),
       m=hnp.arrays(np.bool_, (2, 4)),
       junk=hnp.arrays(np.float32, (2, 4), elements=st.floats(width=32)))
def test_masked_positions_never_change_outputs(v, m, junk):
  vo, r = v[::-1] * 0.5, v * 2.0 + 1.0
  clean = (_vl(v, vo, r, m), _ev(v, r, m), _eb(v, m))
  dirty = (_vl(np.where(m, v, junk), np.where(m, vo, junk), np.where(m, r, junk), m),
           _ev(np.where(m, v, junk), np.where(m, r, -junk), m), _eb(np.where(m, v, junk), m))
  for a, b in zip(jax.tree.leaves(clean), jax.tree.leaves(dirty)):
    np.testing.assert_array_equal(a, b)
    assert np.all(np.isfinite(a))
