"""Decoder: KV-cache prefill + decode equals the full forward; masking; remat; bf16."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tolerances import assert_close_f32, f32_atol

from rljax.models import Decoder, ModelConfig, positions_from_mask
from rljax.models.logprobs import token_logprobs
from rljax.models.stack import LayerStack, per_layer_layout, stack_like
from rljax.models.testing import perturb_params

CFG = ModelConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_layers=2,
                  num_heads=4, num_kv_heads=2, head_dim=16, attention_bias=True, qk_norm=True)


def _left_padded(rng, b, p, t, vocab):
  """Prompts of varied length left-padded to P, then T completion tokens."""
  lengths = np.array([p, p - 2, 1, p - 3])[:b]
  prompt_mask = (np.arange(p)[None] >= p - lengths[:, None]).astype(np.int32)
  tokens = rng.integers(0, vocab, size=(b, p + t)).astype(np.int32)
  mask = np.concatenate([prompt_mask, np.ones((b, t), np.int32)], axis=1)
  tokens = tokens * mask  # pad id 0
  positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
  return jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(mask)


def _randomize(model, seed):
  """Replace the zero/one initialised biases and norms so every path is exercised."""
  return perturb_params(model, scale=0.1, seed=seed)


@nnx.jit
def _full(model, tokens, positions, mask):
  return model(tokens, positions=positions, attention_mask=mask)


@functools.partial(nnx.jit, static_argnames="fused")
def _cached(model, tokens, positions, cache, start, kv_mask, fused=False):
  return model.forward_cached(tokens, positions=positions, cache=cache, start=start,
                              kv_mask=kv_mask, fused=model.fused_weights() if fused else None)


@pytest.mark.parametrize("dtype,atol,fused,tied", [
    ("float32", None, False, False), ("float32", None, True, False),
    ("float32", None, True, True), ("bfloat16", 0.05, False, False)])
def test_kv_cache_decode_equals_full_forward_left_padded(dtype, atol, fused, tied):
  """Also with the decode loop's fused q|k|v and gate|up matmuls (`fused_weights`), and
  with a tied lm head (the decode step's flipped product, `few_row_logits`)."""
  cfg = CFG.replace(dtype=dtype, qk_norm=True, tie_embeddings=tied)
  model = _randomize(Decoder(cfg, rngs=nnx.Rngs(0)), 1)
  b, p, t, s_max = 4, 6, 5, 16
  tokens, positions, mask = _left_padded(np.random.default_rng(0), b, p, t, CFG.vocab_size)
  full = np.asarray(_full(model, tokens, positions, mask))
  if atol is None:   # float32: cached and full forwards sum in other orders (bf16: 8 bits)
    atol = f32_atol(full, ulps=256)
  kv_mask = jnp.zeros((b, s_max), jnp.int32).at[:, :p].set(mask[:, :p])
  cache = model.init_cache(b, s_max)
  logits, cache = _cached(model, tokens[:, :p], positions[:, :p], cache, jnp.int32(0), kv_mask)
  real = np.asarray(mask[:, :p], bool)
  np.testing.assert_allclose(np.asarray(logits)[real], full[:, :p][real], atol=atol, rtol=1e-5)
  for i in range(p, p + t):  # one compiled decode step, start traced
    kv_mask = kv_mask.at[:, i].set(1)
    logits, cache = _cached(model, tokens[:, i:i + 1], positions[:, i:i + 1], cache,
                            jnp.int32(i), kv_mask, fused=fused)
    np.testing.assert_allclose(np.asarray(logits)[:, 0], full[:, i], atol=atol, rtol=1e-5)


def test_padding_does_not_change_real_positions_and_padded_rows_are_finite():
  model = _randomize(Decoder(CFG, rngs=nnx.Rngs(1)), 2)
  tok = jnp.array([[5, 6, 7, 8]], jnp.int32)
  ones = jnp.ones_like(tok)
  ref = _full(model, tok, jnp.arange(4)[None], ones)
  padded = jnp.concatenate([jnp.full((1, 3), -1, jnp.int32), tok], axis=1)  # pad id -1
  pmask = jnp.concatenate([jnp.zeros((1, 3), jnp.int32), ones], axis=1)
  ppos = jnp.maximum(jnp.cumsum(pmask, axis=1) - 1, 0)
  out = _full(model, padded, ppos, pmask)
  default = nnx.jit(lambda m, t, a: m(t, attention_mask=a))(model, padded, pmask)
  np.testing.assert_array_equal(np.asarray(default), np.asarray(out))  # positions default
  assert np.all(np.isfinite(np.asarray(out)))  # fully masked query rows (padding) stay finite
  assert_close_f32(out[:, 3:], ref, ulps=256)   # padded vs unpadded: other attention sums


def test_positions_from_mask_golden():
  mask = jnp.array([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
  np.testing.assert_array_equal(positions_from_mask(mask),
                                [[0, 0, 0, 1, 2], [0, 1, 2, 2, 2], [0, 1, 2, 3, 4]])


def test_remat_gives_same_values_and_gradients():
  tokens, positions, mask = _left_padded(np.random.default_rng(1), 2, 4, 3, CFG.vocab_size)
  grads = []
  for remat in (False, True):
    model = _randomize(Decoder(CFG.replace(remat=remat, num_layers=1), rngs=nnx.Rngs(3)), 4)
    loss = lambda m: jnp.mean(m(tokens, positions=positions, attention_mask=mask) ** 2)
    grads.append(jax.tree.leaves(nnx.jit(nnx.grad(loss))(model)))
  # remat recomputes the forward in another program; the bound scales with the largest
  # gradient (some leaves, e.g. the key bias, are ~0 up to rounding)
  g_max = max(float(np.abs(np.asarray(g)).max()) for g in grads[0])
  for a, b in zip(*grads):
    assert_close_f32(a, b, ulps=256, scale=g_max)


def test_scanned_decoder_starts_from_the_per_layer_decoders_values():
  """Same seed, same parameters: the stack stacks the L blocks a per-layer decoder builds."""
  scanned = Decoder(CFG.replace(num_layers=3), rngs=nnx.Rngs(4))
  looped = Decoder(CFG.replace(num_layers=3, scan_layers=False), rngs=nnx.Rngs(4))
  assert isinstance(scanned.layers[0], LayerStack) and len(looped.layers) == 3
  assert scanned.layers[0].layer.mlp.gate.get_metadata()["out_sharding"] == (
      "layers", "embed", "mlp")
  want = jax.tree.leaves(nnx.state(looped))
  got = jax.tree.leaves(per_layer_layout(nnx.state(scanned)))
  assert len(got) == len(want)
  for a, b in zip(got, want):
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("remat", [False, True])
def test_scanned_and_per_layer_decoders_give_equal_logits_and_gradients(remat):
  """One scan over stacked layers == a Python loop over the layers: logits, log-probs and
  every gradient, taken as the trainer takes them (plain `jax.grad` of a merged module)."""
  cfg = CFG.replace(num_layers=3, remat=remat)
  looped = _randomize(Decoder(cfg.replace(scan_layers=False), rngs=nnx.Rngs(7)), 8)
  scanned = Decoder(cfg, rngs=nnx.Rngs(0))
  nnx.update(scanned, stack_like(nnx.state(looped), nnx.state(scanned)))
  tokens, positions, mask = _left_padded(np.random.default_rng(3), 3, 5, 4, CFG.vocab_size)

  def value_and_grad(model):
    graphdef, state = nnx.split(model)

    def loss(state):
      m = nnx.merge(graphdef, state)
      logp = token_logprobs(m, tokens, positions, mask, prompt_len=5, chunk_size=3)
      return jnp.sum(logp), m(tokens, positions=positions, attention_mask=mask)
    return jax.jit(jax.value_and_grad(loss, has_aux=True))(state)

  (want_loss, want_logits), want_grad = value_and_grad(looped)
  (got_loss, got_logits), got_grad = value_and_grad(scanned)
  # the scan's body is the loop's block compiled once: other fusions, the same math
  assert_close_f32(got_logits, want_logits, ulps=256)
  assert_close_f32(got_loss, want_loss, ulps=256, scale=np.abs(np.asarray(want_loss)) + 1)
  want_leaves = jax.tree.leaves(want_grad)
  got_leaves = jax.tree.leaves(per_layer_layout(got_grad))
  assert len(got_leaves) == len(want_leaves)
  g_max = max(float(np.abs(np.asarray(g)).max()) for g in want_leaves)
  for a, b in zip(got_leaves, want_leaves):
    assert_close_f32(a, b, ulps=256, scale=g_max)


def test_bf16_compute_close_to_fp32(param_dtype="bfloat16"):
  """bf16 compute and storage (bf16 compute with fp32 storage: test_models_logprobs)."""
  tokens, positions, mask = _left_padded(np.random.default_rng(2), 2, 4, 3, CFG.vocab_size)
  m32 = _randomize(Decoder(CFG, rngs=nnx.Rngs(5)), 6)
  m16 = Decoder(CFG.replace(dtype="bfloat16", param_dtype=param_dtype), rngs=nnx.Rngs(5))
  nnx.update(m16, jax.tree.map(lambda x: x.astype(param_dtype), nnx.state(m32, nnx.Param)))
  l32 = np.asarray(_full(m32, tokens, positions, mask))
  l16 = _full(m16, tokens, positions, mask)
  assert l16.dtype == jnp.float32  # logits always float32
  real = np.asarray(mask, bool)
  # bf16 has 8 mantissa bits; logits of this tiny model are O(1).
  assert np.max(np.abs(np.asarray(l16) - l32)[real]) < 0.05


@pytest.mark.parametrize("f,d", [(12, 5), (5, 12)])
def test_dense_value_and_gradients_equal_the_matmul(f, d):
  """`layers.dense` only changes how XLA lays out the weight gradient, not its value."""
  from rljax.models.layers import dense
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(3, 4, f)), jnp.float32)
  w = jnp.asarray(rng.normal(size=(f, d)), jnp.float32)
  ct = jnp.asarray(rng.normal(size=(3, 4, d)), jnp.float32)
  loss = lambda fn: lambda x, w: jnp.sum(jnp.sin(fn(x, w)) * ct)
  got = jax.grad(loss(dense), argnums=(0, 1))(x, w)
  x64, w64, ct64 = (np.asarray(a, np.float64) for a in (x, w, ct))
  g = np.cos(x64 @ w64) * ct64                       # d loss / d (x w), by hand
  # float32 matmuls (sums of ≤ 12 terms) and sin/cos vs float64
  assert_close_f32(got[0], g @ w64.T, ulps=64)
  assert_close_f32(got[1], np.einsum("bsf,bsd->fd", x64, g), ulps=64)
  assert_close_f32(dense(x, w), x64 @ w64, ulps=64)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_swiglu_value_and_gradients_equal_float64_finite_differences(dtype):
  """`layers.swiglu`'s written-out gradient against central differences of silu(g)·u
  (Shazeer 2020, Eq. 6; silu(x) = x / (1 + e^-x)) in float64, and against autodiff."""
  from rljax.models.layers import swiglu
  rng = np.random.default_rng(0)
  g64, u64, ct64 = (rng.normal(scale=3.0, size=(4, 6)) for _ in range(3))
  silu_u = lambda g, u: g / (1 + np.exp(-g)) * u  # noqa: E731
  eps = 1e-6
  want_dg = (silu_u(g64 + eps, u64) - silu_u(g64 - eps, u64)) / (2 * eps) * ct64
  want_du = (silu_u(g64, u64 + eps) - silu_u(g64, u64 - eps)) / (2 * eps) * ct64
  g, u, ct = (jnp.asarray(a, dtype) for a in (g64, u64, ct64))
  dg, du = jax.grad(lambda g, u: jnp.sum((swiglu(g, u) * ct).astype(jnp.float32)),
                    argnums=(0, 1))(g, u)
  assert dg.dtype == du.dtype == jnp.dtype(dtype)
  if dtype == "float32":
    np.testing.assert_allclose(swiglu(g, u), silu_u(g64, u64), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dg, want_dg, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(du, want_du, rtol=1e-5, atol=1e-5)
    auto = jax.grad(lambda g, u: jnp.sum(jax.nn.silu(g) * u * ct), argnums=(0, 1))(g, u)
    assert_close_f32(dg, auto[0], ulps=16)
    assert_close_f32(du, auto[1], ulps=16)
  else:   # bf16 inputs and arithmetic: 8 mantissa bits
    scale = np.abs(want_dg).max()
    assert np.abs(np.asarray(dg, np.float64) - want_dg).max() < 0.05 * scale
    assert np.abs(np.asarray(du, np.float64) - want_du).max() < 0.05 * np.abs(want_du).max()


def test_swiglu_down_equals_the_plain_mlp_tail_and_keeps_no_hidden_activation():
  """`layers.swiglu_down`: value and gradients of (silu(g)·u) W written in NumPy float64
  (Shazeer 2020, Eq. 6), bitwise those of `dense(swiglu(g, u), w)` in float32, and its
  backward keeps g, u and W only (the plain form also keeps the [N, F] product)."""
  from rljax.models.layers import dense, swiglu, swiglu_down
  rng = np.random.default_rng(1)
  g64, u64 = rng.normal(size=(2, 2, 3, 8))
  w64, ct64 = rng.normal(size=(8, 5)), rng.normal(size=(2, 3, 5))
  sig = 1 / (1 + np.exp(-g64))
  hidden = g64 * sig * u64
  d_hidden = ct64 @ w64.T
  want = (hidden @ w64, d_hidden * u64 * sig * (1 + g64 * (1 - sig)), d_hidden * g64 * sig,
          hidden.reshape(-1, 8).T @ ct64.reshape(-1, 5))
  jax.config.update("jax_enable_x64", True)
  try:
    out, vjp = jax.vjp(swiglu_down, g64, u64, w64)
    for got, ref in zip((out, *vjp(ct64)), want):
      np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)
  finally:
    jax.config.update("jax_enable_x64", False)
  g, u, w, ct = (jnp.asarray(a, jnp.float32) for a in (g64, u64, w64, ct64))
  plain = lambda g, u, w: dense(swiglu(g, u), w)  # noqa: E731
  (out_a, vjp_a), (out_b, vjp_b) = jax.vjp(plain, g, u, w), jax.vjp(swiglu_down, g, u, w)
  for a, b in zip((out_a, *vjp_a(ct)), (out_b, *vjp_b(ct))):
    np.testing.assert_array_equal(a, b)
  kept = lambda vjp_fn: sorted(x.size for x in jax.tree.leaves(vjp_fn))  # noqa: E731
  assert kept(vjp_b) == sorted([g.size, u.size, w.size])
  assert kept(vjp_a) == sorted([g.size, u.size, w.size, g.size])


def test_cache_in_the_old_untransposed_key_layout_is_refused_by_name():
  model = Decoder(CFG, rngs=nnx.Rngs(0))
  cache = model.init_cache(2, 8)
  old_layout = cache._replace(k=tuple(k.swapaxes(2, 3) for k in cache.k))   # [B,K,S,Dh]
  tokens = jnp.ones((2, 3), jnp.int32)
  with pytest.raises(ValueError, match=r"\[B,K,Dh,S_max\].*init_cache"):
    model.forward_cached(tokens, positions=jnp.zeros((2, 3), jnp.int32), cache=old_layout,
                         start=0, kv_mask=jnp.ones((2, 8), jnp.int32))
  logits, new_cache = model.forward_cached(tokens, positions=jnp.zeros((2, 3), jnp.int32),
                                           cache=cache, start=0, kv_mask=jnp.ones((2, 8), jnp.int32))
  assert logits.shape == (2, 3, CFG.vocab_size)
  assert [k.shape for k in new_cache.k] == [k.shape for k in cache.k]


@pytest.mark.parametrize("shape", [(1, 64), (8, 1, 64), (4, 16, 64), (65, 64), (5, 13, 64)])
@pytest.mark.parametrize("tied", [True, False])
def test_few_row_logits_equal_the_lm_head_in_float64(shape, tied):
  """The decode step's lm head equals h @ W (NumPy, float64) at any row count; a tied head
  of <= FEW_ROWS rows is the flipped product (E @ h.T behind an optimization barrier)."""
  from rljax.models.decoder import FEW_ROWS
  model = Decoder(CFG.replace(tie_embeddings=tied), rngs=nnx.Rngs(3))
  hidden = jax.random.normal(jax.random.key(4), shape)
  logits = nnx.jit(lambda m, h: m.few_row_logits(h))(model, hidden)
  w = np.asarray(model.embed[...], np.float64).T if tied else np.asarray(model.lm_head[...])
  want = np.asarray(hidden, np.float64) @ w
  assert logits.shape == want.shape and logits.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(logits), want, atol=f32_atol(want, ulps=64), rtol=1e-5)
  hlo = jax.jit(lambda h: model.few_row_logits(h)).lower(hidden).as_text()
  rows = int(np.prod(shape[:-1]))
  assert ("optimization_barrier" in hlo) == (tied and rows <= FEW_ROWS)
