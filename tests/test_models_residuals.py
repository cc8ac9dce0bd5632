"""What the model keeps for its backward: the xla attention's softmax (its backward against the
softmax Jacobian written out in NumPy, one kept array), RMSNorm (its backward against
float64 NumPy, two kept arrays), the head projections (their weight itself, not a reshaped
copy) and a block input feeding several projections (kept once)."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rljax.models import Decoder
from rljax.models.attention import masked_softmax, softmax_saving_output
from rljax.models.layers import dense_heads
from rljax.models.norm import rms_norm
from rljax.models.testing import tiny_config


def _jacobian_vjp(x, dy):
  """dx_i = Σ_j dy_j ∂y_j/∂x_i with ∂y_j/∂x_i = y_j (δ_ij − y_i), y = softmax(x), per row."""
  z = np.exp(x - x.max(-1, keepdims=True))
  y = z / z.sum(-1, keepdims=True)
  jac = y[..., None, :] * (np.eye(x.shape[-1]) - y[..., :, None])   # [..., i, j]
  return np.einsum("...ij,...j->...i", jac, dy)


def test_backward_is_the_softmax_jacobian():
  rng = np.random.default_rng(0)
  x, dy = rng.normal(size=(3, 5, 7)) * 3, rng.normal(size=(3, 5, 7))
  y, vjp = jax.vjp(softmax_saving_output, jnp.asarray(x, jnp.float32))
  np.testing.assert_allclose(y, jax.nn.softmax(jnp.asarray(x, jnp.float32)), rtol=0, atol=0)
  (dx,) = vjp(jnp.asarray(dy, jnp.float32))
  np.testing.assert_allclose(dx, _jacobian_vjp(x, dy), rtol=1e-5, atol=1e-6)


def test_masked_rows_get_no_gradient_and_a_fully_masked_row_stays_finite():
  rng = np.random.default_rng(1)
  x, w = rng.normal(size=(2, 4, 4)), rng.normal(size=(2, 4, 4))
  mask = np.tril(np.ones((4, 4), bool))
  mask[:, 0] = False                                     # row 0 sees no key at all
  grad = jax.grad(lambda s: (masked_softmax(s, mask, jnp.float32) * w).sum())(
      jnp.asarray(x, jnp.float32))
  assert np.all(np.asarray(grad)[:, ~mask] == 0)
  assert np.all(np.isfinite(grad))
  x_visible = np.where(mask, x, -np.inf)[:, 1:]          # rows that see a key: the Jacobian
  want = _jacobian_vjp(np.where(mask[1:], x[:, 1:], -1e30), w[:, 1:])
  np.testing.assert_allclose(np.asarray(grad)[:, 1:], np.where(np.isfinite(x_visible), want, 0),
                             rtol=1e-5, atol=1e-6)


def test_attention_keeps_one_scores_sized_array_for_its_backward():
  """P V's backward needs P; jax.nn.softmax's autodiff also keeps exp(x - max). With this
  softmax P is the only [.., S, T] array kept (per layer of a model: one instead of two)."""
  x, v = jnp.ones((2, 3, 6, 6)), jnp.ones((2, 3, 6, 4))

  def kept(softmax):
    vjp = jax.vjp(lambda s, v: softmax(s) @ v, x, v)[1]
    return len({id(a) for a in jax.tree.leaves(vjp) if a.shape == x.shape})

  assert kept(lambda s: jax.nn.softmax(s, axis=-1)) == 2
  assert kept(softmax_saving_output) == 1


def test_dense_heads_values_and_gradients_from_the_equations():
  rng = np.random.default_rng(3)
  for w_shape in ((6, 2, 4), (2, 3, 6)):   # q/k/v [D, H, Dh] and o [H, Dh, D]
    x, w = rng.normal(size=(5, 6)), rng.normal(size=w_shape)
    w2 = w.reshape(6, -1)
    g = rng.normal(size=(5, w2.shape[1]))
    y, vjp = jax.vjp(dense_heads, jnp.asarray(x, jnp.float32), jnp.asarray(w, jnp.float32))
    np.testing.assert_allclose(y, x @ w2, rtol=1e-5, atol=1e-5)
    dx, dw = vjp(jnp.asarray(g, jnp.float32))
    np.testing.assert_allclose(dx, g @ w2.T, rtol=1e-5, atol=1e-5)       # dL/dx = g Wᵀ
    np.testing.assert_allclose(dw, (x.T @ g).reshape(w_shape), rtol=1e-5, atol=1e-5)


def test_a_scanned_layer_keeps_its_input_once_and_no_weight_copy():
  """vjp residuals of one scanned decoder forward: the [N, D] input of q/k/v and of
  gate/up kept once per layer stack (not once per projection), and no stacked array shaped
  like a head weight [L, D, H·Dh] (the weight is read from the parameter itself)."""
  cfg = tiny_config().replace(attention="xla", scan_layers=True, hidden_size=48,
                              intermediate_size=80)
  model = Decoder(cfg, rngs=nnx.Rngs(0))
  graphdef, state = nnx.split(model)
  tokens = jnp.asarray(np.random.default_rng(4).integers(1, cfg.vocab_size, (2, 7)))
  _, vjp = jax.vjp(lambda st: nnx.merge(graphdef, st)(tokens), state)
  kept = [a for a in jax.tree.leaves(vjp) if hasattr(a, "shape")]
  n, d, layers = 2 * 7, cfg.hidden_size, cfg.num_layers
  q_width = cfg.num_heads * cfg.head_dim
  inputs = [a for a in kept if a.shape == (layers, n, d)]
  assert len(inputs) <= 2, [a.shape for a in kept]          # attention's and the MLP's
  assert not [a for a in kept if a.shape in ((layers, d, q_width), (layers, q_width, d))]


def _rms_norm_grads(x, s, dy, eps):
  """RMSNorm's gradients in float64, from y = x r s, r = (mean(x²) + ε)^(-1/2):
  ∂r/∂x_i = -r³ x_i / D, so dx = r g - r³ x mean(g x) with g = dy s; ds = Σ_rows dy x r."""
  r = 1 / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps)
  g = dy * s
  dx = r * g - r ** 3 * x * np.mean(g * x, -1, keepdims=True)
  return dx, (dy * x * r).reshape(-1, x.shape[-1]).sum(0)


def test_rms_norm_gradients_from_the_equations():
  rng = np.random.default_rng(5)
  x, s, dy = rng.normal(size=(2, 3, 8)) * 2, rng.normal(size=8), rng.normal(size=(2, 3, 8))
  y, vjp = jax.vjp(lambda x, s: rms_norm(x, s, 1e-6), jnp.asarray(x, jnp.float32),
                   jnp.asarray(s, jnp.float32))
  r = 1 / np.sqrt(np.mean(x * x, -1, keepdims=True) + 1e-6)
  np.testing.assert_allclose(y, x * r * s, rtol=1e-5, atol=1e-6)
  dx, ds = vjp(jnp.asarray(dy, jnp.float32))
  want_dx, want_ds = _rms_norm_grads(x, s, dy, 1e-6)
  np.testing.assert_allclose(dx, want_dx, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(ds, want_ds, rtol=1e-4, atol=1e-5)


def test_rms_norm_keeps_its_input_and_the_inverse_root_mean_square():
  x, s = jnp.ones((4, 8)), jnp.ones((8,))
  kept = jax.tree.leaves(jax.vjp(lambda x, s: rms_norm(x, s, 1e-6), x, s)[1])
  assert sorted(a.shape for a in kept if hasattr(a, "shape")) == [(4, 1), (4, 8), (8,)]
