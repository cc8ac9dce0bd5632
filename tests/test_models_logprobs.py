"""Chunked per-token log-probs / entropies vs a naive full log-softmax; bf16 tolerance."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tolerances import assert_close_f32

from rljax.models import Decoder, ModelConfig
from rljax.models.logprobs import (
  logprobs_and_entropy_from_hidden,
  logprobs_from_hidden,
  token_logprobs,
  token_logprobs_and_entropy,
)
from rljax.models.testing import perturb_params

CFG = ModelConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_layers=2,
                  num_heads=4, num_kv_heads=2, head_dim=16, arch="qwen2")
# bf16 compute vs fp32 on this tiny random model: max |Δ logp| measured 0.012-0.02
# over several seeds; the documented tolerance (also in rljax.models.logprobs) is 0.06.
BF16_LOGP_ATOL = 0.06


def test_golden_two_token_vocab():
  """z = [0, ln 3]: p = [1/4, 3/4]; at τ=2, p ∝ [1, √3]."""
  w = jnp.array([[0.0, math.log(3.0)]])  # D=1 -> V=2
  h = jnp.ones((1, 1, 1))
  y = jnp.array([[1]])
  logp, ent = logprobs_and_entropy_from_hidden(h, y, lambda x: x @ w, temperature=1.0)
  np.testing.assert_allclose(logp, [[math.log(0.75)]], rtol=1e-6)
  np.testing.assert_allclose(ent, [[-(0.25 * math.log(0.25) + 0.75 * math.log(0.75))]],
                             rtol=1e-6)
  logp2 = logprobs_from_hidden(h, y, lambda x: x @ w, temperature=2.0)
  np.testing.assert_allclose(logp2, [[math.log(math.sqrt(3) / (1 + math.sqrt(3)))]],
                             rtol=1e-6)


def _naive(h, y, w, tau):
  logits = np.asarray(h, np.float64) @ np.asarray(w, np.float64) / tau
  logits -= logits.max(-1, keepdims=True)
  logsm = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  logp = np.take_along_axis(logsm, np.asarray(y)[..., None], -1)[..., 0]
  ent = -(np.exp(logsm) * logsm).sum(-1)
  return logp, ent


@pytest.mark.parametrize("chunk_size", [1, 3, 4, 7, 128])
def test_chunked_equals_naive(chunk_size):
  rng = np.random.default_rng(0)
  b, t, d, v = 2, 7, 8, 33  # chunk 3 and 4 do not divide T=7
  h = jnp.asarray(rng.standard_normal((b, t, d)), jnp.float32)
  w = jnp.asarray(rng.standard_normal((d, v)), jnp.float32)
  y = jnp.asarray(rng.integers(0, v, (b, t)), jnp.int32)
  fn = jax.jit(lambda h, y: logprobs_and_entropy_from_hidden(
      h, y, lambda x: x @ w, temperature=0.7, chunk_size=chunk_size))
  logp, ent = fn(h, y)
  ref_logp, ref_ent = _naive(h, y, w, 0.7)
  # float32 matmul (D = 8) and log-softmax (V = 33) vs float64: rounding scales with the logits
  z_max = float(jnp.abs(h @ w).max()) / 0.7
  assert_close_f32(logp, ref_logp, ulps=64, scale=z_max)
  assert_close_f32(ent, ref_ent, ulps=64, scale=z_max)
  # relation: the jax.nn.log_softmax reference on full logits, and its gradient
  naive = lambda h: jnp.take_along_axis(
      jax.nn.log_softmax(h @ w / 0.7), y[..., None], -1)[..., 0]
  weights = jnp.arange(b * t, dtype=jnp.float32).reshape(b, t)
  g_chunk = jax.grad(lambda h: jnp.sum(weights * fn(h, y)[0]))(h)
  g_naive = jax.grad(lambda h: jnp.sum(weights * naive(h)))(h)
  assert_close_f32(g_chunk, g_naive, ulps=64)   # chunked vs one program: other sums


@pytest.mark.parametrize("rows,positions,vocab,chunk_size,want", [
    (8, 128, 151_936, 128, 32),    # Qwen vocab, 8 rows: 4.9 MB a position, 52 fit -> 32
    (1, 128, 151_936, 128, 128),   # 0.6 MB a position: the cap
    (8, 128, 90, 128, 128),        # the toy task's vocabulary: unchanged
    (8, 20, 90, 128, 20),          # never more than T
    (4096, 128, 151_936, 128, 1),  # nothing fits: one position
])
def test_chunk_positions_keep_a_chunk_within_the_logits_budget(rows, positions, vocab,
                                                               chunk_size, want):
  from rljax.models.logprobs import CHUNK_LOGITS_BYTES, chunk_positions
  got = chunk_positions(rows, positions, vocab, chunk_size)
  assert got == want
  assert got == 1 or 4 * rows * got * vocab <= CHUNK_LOGITS_BYTES


def test_a_smaller_budget_chunks_with_the_same_log_probs(monkeypatch):
  """A budget of 3 positions' logits: chunks of 2 of T = 7 (padded), same values."""
  from rljax.models import logprobs
  rng = np.random.default_rng(2)
  b, t, d, v = 2, 7, 8, 33
  h = jnp.asarray(rng.standard_normal((b, t, d)), jnp.float32)
  w = jnp.asarray(rng.standard_normal((d, v)), jnp.float32)
  y = jnp.asarray(rng.integers(0, v, (b, t)), jnp.int32)
  monkeypatch.setattr(logprobs, "CHUNK_LOGITS_BYTES", 3 * 4 * b * v)
  assert logprobs.chunk_positions(b, t, v, 128) == 2
  logp = logprobs_from_hidden(h, y, lambda x: x @ w)
  ref_logp, _ = _naive(h, y, w, 1.0)
  assert_close_f32(logp, ref_logp, ulps=64, scale=float(jnp.abs(h @ w).max()))


def _batch():
  rng = np.random.default_rng(0)
  p, t = 5, 6
  mask = np.ones((3, p + t), np.int32)
  mask[1, :2] = 0
  mask[2, :4] = 0
  tokens = rng.integers(1, CFG.vocab_size, size=mask.shape) * mask
  positions = np.maximum(np.cumsum(mask, 1) - 1, 0)
  return jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(mask), p


def _perturbed_model(cfg):
  return perturb_params(Decoder(cfg, rngs=nnx.Rngs(0)), scale=0.1, seed=1)


@nnx.jit(static_argnames=("prompt_len",))
def _model_logp(model, tokens, positions, mask, prompt_len):
  return token_logprobs_and_entropy(model, tokens, positions, mask, prompt_len=prompt_len,
                                    temperature=0.8, chunk_size=4)


def test_token_logprobs_match_full_forward():
  model = _perturbed_model(CFG)
  tokens, positions, mask, p = _batch()
  logp, ent = _model_logp(model, tokens, positions, mask, p)
  logits = nnx.jit(lambda m, *a: m(a[0], positions=a[1], attention_mask=a[2]))(
      model, tokens, positions, mask)
  logsm = jax.nn.log_softmax(logits[:, p - 1:-1] / 0.8)
  ref = jnp.take_along_axis(logsm, tokens[:, p:, None], -1)[..., 0]
  # chunked log-probs vs a log-softmax of the full logits: two programs of one forward
  z_max = float(jnp.abs(logits).max()) / 0.8
  assert_close_f32(logp, ref, ulps=256, scale=z_max)
  assert_close_f32(ent, -jnp.sum(jnp.exp(logsm) * logsm, -1), ulps=256, scale=z_max)
  only = nnx.jit(lambda m, *a: token_logprobs(m, *a, prompt_len=p, temperature=0.8))(
      model, tokens, positions, mask)
  assert_close_f32(only, logp, ulps=256, scale=z_max)


def test_bf16_logprobs_within_documented_tolerance_of_fp32():
  model32 = _perturbed_model(CFG)
  model16 = Decoder(CFG.replace(dtype="bfloat16"), rngs=nnx.Rngs(0))
  nnx.update(model16, nnx.state(model32, nnx.Param))
  tokens, positions, mask, p = _batch()
  lp32, _ = _model_logp(model32, tokens, positions, mask, p)
  lp16, ent16 = _model_logp(model16, tokens, positions, mask, p)
  assert lp16.dtype == jnp.float32 and np.all(np.isfinite(np.asarray(ent16)))
  err = float(jnp.max(jnp.abs(lp16 - lp32)))
  print("bf16 max |dlogp|", err)
  assert 0 < err < BF16_LOGP_ATOL, err
