"""`model.attention`: chunked, splash (Pallas interpret mode) and cudnn (its `jax.nn` call with
the xla implementation) against a NumPy softmax attention written from the equation, values
and gradients, on causal, left-padded and packed batches; the decoder and the sampler with
each path against `xla`; `auto`'s choice; chunked's memory linear in the length."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tolerances import assert_close_f32

from rljax.models import Decoder
from rljax.models import attention_kernels as ak
from rljax.models.attention_chunked import chunked_attention
from rljax.models.config import ModelConfig
from rljax.models.testing import perturb_params, tiny_config
from rljax.parallel import make_mesh
from rljax.sampling import SamplingParams, generate
from rljax.train.config import ConfigError, base_config, validate
from rljax.train.run.task_and_models import tiny_model_config

B, H, K, DH = 2, 4, 2, 8


def reference(q, k, v, mask, dout):
  """softmax(q kᵀ + mask) v per head and its gradients (float64), from the equations:
  P = softmax(S) over visible keys, O = P V; dV = Pᵀ dO, dP = dO Vᵀ,
  dS = P ⊙ (dP - rowsum(dP ⊙ P)), dQ = dS K, dK = dSᵀ Q (Vaswani et al. 2017,
  arXiv:1706.03762, Eq. 1; the softmax Jacobian). q [B,S,H,Dh] (scaled), k/v [B,T,K,Dh],
  mask bool [B,S,T], dout [B,S,H,Dh]. Rows that see no key are 0."""
  q, k, v, dout = (np.asarray(x, np.float64) for x in (q, k, v, dout))
  g = q.shape[2] // k.shape[2]
  out, dq = np.zeros_like(q), np.zeros_like(q)
  dk, dv = np.zeros_like(k), np.zeros_like(k)
  for b in range(q.shape[0]):
    for h in range(q.shape[2]):
      kh, m = h // g, mask[b]
      s = np.where(m, q[b, :, h] @ k[b, :, kh].T, -np.inf)
      p = np.exp(s - np.max(np.where(m, s, -1e300), axis=1, keepdims=True))
      p = np.where(m, p, 0) / np.maximum(np.where(m, p, 0).sum(1, keepdims=True), 1e-300)
      out[b, :, h] = p @ v[b, :, kh]
      dp = dout[b, :, h] @ v[b, :, kh].T
      ds = p * (dp - np.sum(dp * p, axis=1, keepdims=True))
      dq[b, :, h] = ds @ k[b, :, kh]
      dk[b, :, kh] += ds.T @ q[b, :, h]
      dv[b, :, kh] += p.T @ dout[b, :, h]
  return out, (dq, dk, dv)


def batch(kind, s, seed=0):
  """(q, k, v, dout, valid [B,S], segment ids [B,S] or None, mask [B,S,S]) of one kind."""
  rng = np.random.default_rng(seed)
  q, dout = (rng.standard_normal((B, s, H, DH), np.float32) for _ in range(2))
  k, v = (rng.standard_normal((B, s, K, DH), np.float32) for _ in range(2))
  valid = np.ones((B, s), bool)
  seg = None
  if kind == "left_padded":
    valid[0, :5] = False
    valid[1, :s // 2] = False
  if kind == "packed":
    seg = np.zeros((B, s), np.int32)
    seg[0, 6:] = 1
    seg[1, s // 3:] = 1
    seg[1, 2 * s // 3:] = 2
    valid[1, -3:] = False
  mask = valid[:, None, :] & np.tril(np.ones((s, s), bool))[None]
  if seg is not None:
    mask &= seg[:, :, None] == seg[:, None, :]
  return q, k, v, dout, valid, seg, mask


def check(fn, kind, s, ulps=64):
  """`fn(q, k, v, valid, seg)` [B,S,H,Dh] and its vjp equal `reference` on the real rows."""
  q, k, v, dout, valid, seg, mask = batch(kind, s)
  out, vjp = jax.vjp(lambda q, k, v: fn(q, k, v, valid, seg), q, k, v)
  grads = vjp(jnp.where(valid[:, :, None, None], dout, 0))
  want, want_grads = reference(q, k, v, mask, np.where(valid[:, :, None, None], dout, 0))
  # online softmax / cuDNN's or splash's tiling vs one float64 softmax: other sums
  assert_close_f32(np.asarray(out)[valid], want[valid], ulps=ulps)
  for got, ref in zip(grads, want_grads):
    assert_close_f32(got, ref, ulps=ulps)


KINDS = ["causal", "left_padded", "packed"]


@pytest.mark.parametrize("kind", KINDS)
def test_chunked_equals_reference(kind):
  """Tiles of 8 over 21 tokens: padding to whole tiles, skipped tiles, several of each."""
  def fn(q, k, v, valid, seg):
    return chunked_attention(q, k.swapaxes(1, 2), v.swapaxes(1, 2), valid, 0,
                             None if seg is None else (seg, seg), block_q=8, block_k=8)
  check(jax.jit(fn), kind, 21)


def test_chunked_over_a_cache_from_a_row_start():
  """A prefill at start > 0 against an existing prefix (multi-turn): T = 24 slots, 5 new
  queries per row at slots 11.. and 15.., holes in kv_valid, keys after the query hidden."""
  rng = np.random.default_rng(1)
  s, t, start = 5, 24, np.array([11, 15])
  q, dout = (rng.standard_normal((B, s, H, DH), np.float32) for _ in range(2))
  k, v = (rng.standard_normal((B, t, K, DH), np.float32) for _ in range(2))
  valid = np.ones((B, t), bool)
  valid[0, :3] = valid[1, 7:9] = False
  mask = valid[:, None, :] & (np.arange(t) <= (start[:, None] + np.arange(s))[:, :, None])
  out, vjp = jax.vjp(lambda q, k, v: chunked_attention(
      q, k.swapaxes(1, 2), v.swapaxes(1, 2), valid, start, block_q=8, block_k=8), q, k, v)
  want, want_grads = reference(q, k, v, mask, dout)
  assert_close_f32(out, want, ulps=64)
  for got, ref in zip(vjp(dout), want_grads):
    assert_close_f32(got, ref, ulps=64)


@pytest.mark.parametrize("kind,s", [("causal", 128), ("left_padded", 100), ("packed", 128)])
def test_splash_in_interpret_mode_equals_reference(kind, s):
  """The Pallas kernels in interpret mode (CPU); 100 tokens are padded to one 128 tile."""
  fn = functools.partial(ak.splash_attention, block=128, interpret=True)
  check(jax.jit(fn), kind, s)


def test_splash_under_a_mesh_runs_per_shard():
  """Under `jax.set_mesh` (data 2 x fsdp 2 x tensor 2) the kernel runs in a shard_map,
  rows over data x fsdp and KV heads over tensor, with the unsharded values."""
  q, k, v, _, valid, seg, _ = batch("packed", 128)
  q, k, v, valid, seg = (np.concatenate([x, x[::-1]]) for x in (q, k, v, valid, seg))
  fn = jax.jit(functools.partial(ak.splash_attention, block=128, interpret=True))
  with jax.set_mesh(make_mesh(2, 2, 2)):
    assert "manual" in fn.lower(q, k, v, valid, seg).as_text()
    sharded = fn(q, k, v, valid, seg)
  # the same per-row tiles; only XLA's fusion around the kernel may differ
  assert_close_f32(np.asarray(sharded)[valid], np.asarray(fn(q, k, v, valid, seg))[valid],
                   ulps=16)


@pytest.mark.parametrize("kind", ["causal", "left_padded"])
def test_cudnn_call_equals_reference(kind):
  """The cudnn path's `jax.nn.dot_product_attention` call (rows rotated to right padding,
  lengths) with implementation="xla", the one that runs on CPU."""
  fn = lambda q, k, v, valid, seg: ak.cudnn_attention(q, k, v, valid, implementation="xla")  # noqa: E731
  check(jax.jit(fn), kind, 21)


def test_cudnn_falls_back_to_chunked_for_packed_rows(monkeypatch):
  monkeypatch.setattr(ak, "cudnn_attention", None)   # never called with segment ids
  def fn(q, k, v, valid, seg):
    return ak.attend_blocks("cudnn", q, k, v, ak.AttentionMask.full(valid, seg))
  check(jax.jit(fn), "packed", 21)


def test_auto_picks_by_platform_dtype_and_length():
  pick = functools.partial(ak.resolve_attention, "auto")
  # 8 devices and no mesh set: splash could not run per shard
  assert pick(q_len=64, kv_len=64, dtype="float32", platform="tpu") == "chunked"
  with jax.set_mesh(make_mesh(2, 2, 2)):
    assert pick(q_len=64, kv_len=64, dtype="float32", platform="tpu") == "splash"
  assert pick(q_len=64, kv_len=64, dtype="bfloat16", platform="gpu") == "cudnn"
  assert pick(q_len=4096, kv_len=4096, dtype="float32", platform="gpu") == "chunked"
  assert pick(q_len=256, kv_len=256, dtype="bfloat16", platform="cpu") == "xla"
  assert pick(q_len=257, kv_len=256, dtype="bfloat16", platform="cpu") == "chunked"
  assert pick(q_len=4, kv_len=4096, dtype="float32", platform="cpu") == "xla"
  assert ak.resolve_attention("xla", q_len=9999, kv_len=9999, dtype="float32",
                              platform="tpu") == "xla"
  assert ak.target_platform() == "cpu"
  with jax.set_mesh(jax.make_mesh((1,), ("data",))):
    assert jax.jit(lambda: jnp.asarray(ak.target_platform() == "cpu"))()


def test_the_config_field_reaches_the_model_and_a_bad_name_is_named():
  config = base_config()
  assert config.model.attention == "auto" and ModelConfig(1, 8, 8, 1, 1).attention == "auto"
  config.model.attention = "chunked"
  assert tiny_model_config(config, 50).attention == "chunked"
  with pytest.raises(ValueError, match=r"ModelConfig.attention='flash'.*chunked"):
    tiny_config(attention="flash")
  config.model.attention = "flash"
  with pytest.raises(ConfigError, match=r"model.attention='flash' is not one of"):
    validate(config)


@pytest.fixture(scope="module")
def cudnn_as_xla():
  """The cudnn path's call with implementation="xla" (cuDNN runs on GPU only)."""
  original = ak.cudnn_attention
  ak.cudnn_attention = functools.partial(original, implementation="xla")
  yield
  ak.cudnn_attention = original


def _decoder(attention):
  return perturb_params(Decoder(tiny_config(attention=attention), rngs=nnx.Rngs(0)))


@pytest.mark.parametrize("attention", ["chunked", "splash", "cudnn"])
def test_decoder_equals_xla(attention, cudnn_as_xla):
  """Logits on the real tokens of a left-padded batch and of packed rows, and the gradient
  of a log-likelihood, equal the materialised-scores decoder's (same weights)."""
  rng = np.random.default_rng(0)
  tokens = rng.integers(1, 97, (2, 40)).astype(np.int32)
  mask = np.ones((2, 40), np.int32)
  mask[0, :7] = 0
  seg = np.repeat(np.arange(4), 10)[None].repeat(2, 0).astype(np.int32)
  pos = np.tile(np.arange(10), 4)[None].repeat(2, 0).astype(np.int32)

  def run(model):
    def loss(model):
      logits = model(tokens, attention_mask=mask)
      packed = model.hidden_states(tokens, positions=pos, segment_ids=seg)
      nll = jnp.sum(jax.nn.log_softmax(logits)[..., 3] * mask)
      return nll + jnp.sum(model.logits_from_hidden(packed)[..., 5]), (logits, packed)
    return nnx.jit(nnx.value_and_grad(loss, has_aux=True))(model)

  (_, (logits, packed)), grads = run(_decoder(attention))
  (_, (logits_x, packed_x)), grads_x = run(_decoder("xla"))
  # two attention programs: other sums (tests/tolerances.py: a model forward, a gradient)
  assert_close_f32(np.asarray(logits)[mask > 0], np.asarray(logits_x)[mask > 0], ulps=256)
  assert_close_f32(packed, packed_x, ulps=256)
  for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_x)):
    assert_close_f32(got, want, ulps=256)


def test_cached_prefill_and_extension_equal_xla():
  """forward_cached: a prefill at slot 0 (the new tokens' own keys) and a 4-token extension
  at a start per row (chunked over the cache's slots) equal the xla path's logits."""
  rng = np.random.default_rng(2)
  tokens = rng.integers(1, 97, (2, 12)).astype(np.int32)
  kv_mask = np.zeros((2, 20), np.int32)
  kv_mask[0, 3:16] = kv_mask[1, :16] = 1          # row 0: 3 left-padding slots
  pos = np.maximum(np.cumsum(kv_mask, 1) - 1, 0).astype(np.int32)
  out = {}
  for attention in ("chunked", "xla"):
    model = _decoder(attention)

    @jax.jit
    def prefill_extend(state, model=model):
      model = nnx.merge(nnx.graphdef(model), state)
      cache = model.init_cache(2, 20)
      first, cache = model.forward_cached(tokens, positions=pos[:, :12], cache=cache, start=0,
                                          kv_mask=kv_mask)
      start = jnp.array([12, 12])          # traced, one per row
      more, _ = model.forward_cached(tokens[:, :4], positions=pos[:, 12:16], cache=cache,
                                     start=start, kv_mask=kv_mask)
      return first, more
    out[attention] = prefill_extend(nnx.state(model))
  for got, want in zip(out["chunked"], out["xla"]):
    assert_close_f32(np.asarray(got)[:, -4:], np.asarray(want)[:, -4:], ulps=256)


def test_sampler_tokens_equal_with_chunked_and_xla():
  tokens = np.zeros((3, 9), np.int32)
  mask = np.zeros((3, 9), np.int32)
  rng = np.random.default_rng(3)
  for i, n in enumerate([9, 4, 6]):
    tokens[i, 9 - n:] = rng.integers(1, 97, n)
    mask[i, 9 - n:] = 1
  sp = SamplingParams(max_new_tokens=10, temperature=0.8, n=2)
  runs = {a: generate(_decoder(a), tokens, mask, sampling=sp, rng=jax.random.key(0))
          for a in ("chunked", "xla")}
  np.testing.assert_array_equal(runs["chunked"].tokens, runs["xla"].tokens)
  assert_close_f32(runs["chunked"].logp, runs["xla"].logp, ulps=256)


def _temp_bytes(fn, s, heads=4, kv_heads=2, dh=32):
  q = jax.ShapeDtypeStruct((1, s, heads, dh), jnp.float32)
  kv = jax.ShapeDtypeStruct((1, kv_heads, s, dh), jnp.float32)
  valid = jax.ShapeDtypeStruct((1, s), jnp.bool_)
  grad = jax.value_and_grad(lambda q, k, v, m: jnp.sum(fn(q, k, v, m)), argnums=(0, 1, 2))
  return jax.jit(grad).lower(q, kv, kv, valid).compile().memory_analysis().temp_size_in_bytes


def test_chunked_memory_is_linear_in_the_length():
  """Compiled temporaries of value-and-grad at S = 2k / 4k / 8k: chunked's grow linearly
  (its backward keeps no per-tile probabilities), the materialised scores' quadratically."""
  def xla(q, k, v, valid):
    mask = ak.AttentionMask.full(valid).dense(q.shape[1])[:, None]
    g = q.shape[2] // k.shape[1]
    qg = q.reshape(*q.shape[:2], k.shape[1], g, -1)
    p = jax.nn.softmax(jnp.where(mask[:, :, None], jnp.einsum("bskgd,bktd->bkgst", qg, k),
                                 -1e30), -1)
    return jnp.einsum("bkgst,bktd->bskgd", p, v)
  chunked = lambda q, k, v, valid: chunked_attention(q, k, v, valid, 0)  # noqa: E731
  c2, c4, c8 = (_temp_bytes(chunked, s) for s in (2048, 4096, 8192))
  x2, x4, x8 = (_temp_bytes(xla, s) for s in (2048, 4096, 8192))
  # at most linear: doubling S at most doubles them (XLA reuses the tiles' buffers, so the
  # fixed part shrinks as S grows); the scores' quadruple
  assert c2 < c4 <= 2.1 * c2 and c4 < c8 <= 2.1 * c4, (c2, c4, c8)
  assert x4 > 3.5 * x2 and x8 > 3.5 * x4 and c8 < x8 / 20, (x2, x4, x8, c8)
