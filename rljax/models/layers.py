"""Building blocks of the decoder: RMSNorm, RoPE, grouped-query attention, SwiGLU MLP.

Every parameter carries logical axis names in its `out_sharding` metadata
("vocab", "embed", "mlp", "heads", "kv_heads", "kv", "norm"); `rljax.parallel` maps
them to mesh axes. No mesh axis is named here.
"""

from __future__ import annotations

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rljax.models.config import ModelConfig, RopeScaling

_INIT_STD = 0.02


def param(rngs: nnx.Rngs, shape, axes, dtype, init="normal") -> nnx.Param:
  """A parameter annotated with logical axis names (one per dimension)."""
  assert len(axes) == len(shape), (shape, axes)
  if init == "normal":
    value = _INIT_STD * jax.random.normal(rngs.params(), shape, dtype)
  elif init == "ones":
    value = jnp.ones(shape, dtype)
  else:
    value = jnp.zeros(shape, dtype)
  return nnx.Param(value, out_sharding=tuple(axes), eager_sharding=False)


class RMSNorm(nnx.Module):
  """Root-mean-square layer norm, y = x / sqrt(mean(x²) + ε) · g.

  Zhang & Sennrich 2019, "Root Mean Square Layer Normalization", arXiv:1910.07467, Eq. 4.

  Note: the statistics are computed in float32 whatever the compute dtype; the
  normalised activations are cast back to the input dtype before the gain, as in
  `transformers`' LlamaRMSNorm.
  """

  def __init__(self, dim: int, *, eps: float, rngs: nnx.Rngs, param_dtype=jnp.float32):
    self.eps = eps
    self.scale = param(rngs, (dim,), ("norm",), param_dtype, init="ones")

  def __call__(self, x):
    x32 = x.astype(jnp.float32)
    var = jnp.mean(jnp.square(x32), axis=-1, keepdims=True)
    y = (x32 * jax.lax.rsqrt(var + self.eps)).astype(x.dtype)
    return y * self.scale[...].astype(x.dtype)


def rope_inv_freq(head_dim: int, theta: float, scaling: RopeScaling | None) -> np.ndarray:
  """RoPE inverse frequencies θ_i = theta^(-2i/Dh), optionally with Llama-3 scaling.

  Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding",
  arXiv:2104.09864, Eq. 15. Llama-3 scaling: Dubey et al. 2024, "The Llama 3 Herd of
  Models", arXiv:2407.21783 (Sec. 3.3), as implemented by `transformers`
  (`_compute_llama3_parameters`).

  Returns:
    float32 [Dh/2].
  """
  inv = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / head_dim))
  inv = inv.astype(np.float32)
  if scaling is None:
    return inv
  old_len = scaling.original_max_position_embeddings
  low_wavelen = old_len / scaling.low_freq_factor
  high_wavelen = old_len / scaling.high_freq_factor
  wavelen = 2 * math.pi / inv
  scaled = np.where(wavelen > low_wavelen, inv / scaling.factor, inv)
  smooth = (old_len / wavelen - scaling.low_freq_factor) / (
      scaling.high_freq_factor - scaling.low_freq_factor)
  smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
  medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
  return np.where(medium, smoothed, scaled).astype(np.float32)


def rope_cos_sin(positions_bs, cfg: ModelConfig):
  """cos/sin tables for the given positions: float32 [B,S,Dh] each (halves repeated)."""
  inv = jnp.asarray(rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling))
  freqs = positions_bs.astype(jnp.float32)[..., None] * inv  # [B,S,Dh/2]
  emb = jnp.concatenate([freqs, freqs], axis=-1)  # [B,S,Dh]
  return jnp.cos(emb), jnp.sin(emb)


def apply_rope(x_bshd, cos_bsd, sin_bsd):
  """Rotates pairs (x_i, x_{i+Dh/2}) by position·θ_i (RoFormer Eq. 34, "rotate-half" layout).

  Note: pairs are split in halves (the `transformers` layout), not interleaved as in
  the paper; the two are the same up to a fixed permutation of the weights.
  """
  x = x_bshd.astype(jnp.float32)
  half = x.shape[-1] // 2
  rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
  out = x * cos_bsd[:, :, None, :] + rotated * sin_bsd[:, :, None, :]
  return out.astype(x_bshd.dtype)


class Attention(nnx.Module):
  """Causal grouped-query attention with RoPE, optional q/k bias and q/k RMSNorm.

  Vaswani et al. 2017, "Attention Is All You Need", arXiv:1706.03762, Eq. 1;
  grouped-query attention: Ainslie et al. 2023, arXiv:2305.13245 (Sec. 2.2).

  Note: K/V heads are never repeated; queries are reshaped to [B,S,K,G,Dh] and
  attend to their group's K/V head. Softmax runs in float32; masked scores are set to
  the float32 minimum, so a fully masked query row gives a finite (uniform) output.
  """

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    d, h, k, dh, pd = (cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                       cfg.weight_dtype)
    self.cfg = cfg
    self.q = param(rngs, (d, h, dh), ("embed", "heads", "kv"), pd)
    self.k = param(rngs, (d, k, dh), ("embed", "kv_heads", "kv"), pd)
    self.v = param(rngs, (d, k, dh), ("embed", "kv_heads", "kv"), pd)
    self.o = param(rngs, (h, dh, d), ("heads", "kv", "embed"), pd)
    if cfg.attention_bias:
      self.q_bias = param(rngs, (h, dh), ("heads", "kv"), pd, init="zeros")
      self.k_bias = param(rngs, (k, dh), ("kv_heads", "kv"), pd, init="zeros")
      self.v_bias = param(rngs, (k, dh), ("kv_heads", "kv"), pd, init="zeros")
    if cfg.attention_out_bias:
      self.o_bias = param(rngs, (d,), ("embed",), pd, init="zeros")
    if cfg.qk_norm:
      self.q_norm = RMSNorm(dh, eps=cfg.rms_norm_eps, rngs=rngs, param_dtype=pd)
      self.k_norm = RMSNorm(dh, eps=cfg.rms_norm_eps, rngs=rngs, param_dtype=pd)

  def fused_qkv(self):
    """The q|k|v projections as one [D, (H+2K)·Dh] matrix (and bias, or None), for decoding.

    LoRA adapters (`rljax.models.lora`) are merged in, W + (α/r)·A·B: exact, and done once
    per call, i.e. once per rollout, so decoding runs at the speed of the base model.
    """
    dt, d = self.cfg.compute_dtype, self.cfg.hidden_size
    flat = lambda name: merged_weight(self, name).reshape(d, -1).astype(dt)  # noqa: E731
    w = jnp.concatenate([flat("q"), flat("k"), flat("v")], axis=1)
    if not self.cfg.attention_bias:
      return w, None
    b = jnp.concatenate([self.q_bias[...].reshape(-1), self.k_bias[...].reshape(-1),
                         self.v_bias[...].reshape(-1)]).astype(dt)
    return w, b

  def qkv(self, x_bsd, cos, sin, fused=None):
    """Projects to queries [B,S,H,Dh] and keys/values [B,S,K,Dh], RoPE applied.

    `fused` = `fused_qkv()` computes the three projections as one matmul (same values):
    a decode step's matmuls have a few rows only, where one [D, (H+2K)·Dh] product is
    2-2.5x faster on CPU than three narrow ones.
    """
    dt = self.cfg.compute_dtype
    if fused is None:
      q = with_lora(self, "q", x_bsd, _project_heads(x_bsd, self.q[...].astype(dt)))
      k = with_lora(self, "k", x_bsd, _project_heads(x_bsd, self.k[...].astype(dt)))
      v = with_lora(self, "v", x_bsd, _project_heads(x_bsd, self.v[...].astype(dt)))
      if self.cfg.attention_bias:
        q = q + self.q_bias[...].astype(dt)
        k = k + self.k_bias[...].astype(dt)
        v = v + self.v_bias[...].astype(dt)
    else:
      q, k, v = self._split_fused(x_bsd, *fused)
    if self.cfg.qk_norm:
      q, k = self.q_norm(q), self.k_norm(k)
    return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

  def _split_fused(self, x_bsd, w, b):
    c = self.cfg
    y = dense(x_bsd, w) if b is None else dense(x_bsd, w) + b
    q, k, v = jnp.split(y, [c.num_heads * c.head_dim, (c.num_heads + c.num_kv_heads) * c.head_dim],
                        axis=-1)
    heads = lambda t: t.reshape(*t.shape[:-1], -1, c.head_dim)  # noqa: E731
    return heads(q), heads(k), heads(v)

  def attend(self, q_bshe, k_bkdt, v_bkte, mask_bst):
    """Softmax(q kᵀ / sqrt(Dh) + mask) v, then the output projection -> [B,S,D].

    Args:
      q_bshe: queries [B,S,H,Dh].
      k_bkdt: keys [B,K,Dh,T], transposed (the KV-cache layout): q kᵀ is then a plain
        [G,Dh] x [Dh,T] matmul per (row, KV head), read in place.
      v_bkte: values [B,K,T,Dh].
      mask_bst: bool [B,S,T], True = query s may attend key t.
    """
    b, s, h, dh = q_bshe.shape
    kh = k_bkdt.shape[1]
    chex.assert_shape(mask_bst, (b, s, k_bkdt.shape[3]))
    q = q_bshe.reshape(b, s, kh, h // kh, dh) * jnp.asarray(dh ** -0.5, q_bshe.dtype)
    if s == 1:
      out = _one_query_attention(q[:, 0], k_bkdt, v_bkte, mask_bst[:, 0]).reshape(b, s, h, dh)
    else:
      scores = jnp.einsum("bskgd,bkdt->bkgst", q, k_bkdt,
                          preferred_element_type=jnp.float32)  # [B,K,G,S,T]
      scores = jnp.where(mask_bst[:, None, None], scores, jnp.finfo(jnp.float32).min)
      probs = jax.nn.softmax(scores, axis=-1).astype(v_bkte.dtype)
      out = jnp.einsum("bkgst,bktd->bskgd", probs, v_bkte).reshape(b, s, h, dh)
    dt = self.cfg.compute_dtype
    o_hed = self.o[...].astype(dt)
    out_bsf = out.reshape(b, s, h * dh)
    y = with_lora(self, "o", out_bsf, dense(out_bsf, o_hed.reshape(h * dh, o_hed.shape[-1])))
    if self.cfg.attention_out_bias:
      y = y + self.o_bias[...].astype(dt)
    return y


def with_lora(module, name, x_bsf, y):
  """y + (α/r)·(x A) B when `module` carries a LoRA adapter for projection `name`, else y.

  The unmerged form of Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language
  Models", arXiv:2106.09685, Eq. 3 (h = W₀x + BAx, scaled by α/r): two thin matmuls, so
  the gradient reaches A and B without materialising W + BA. The adapters are stored in
  float32 and used in the compute dtype of `x`.

  Args:
    x_bsf: the projection's input, flattened over its input axes [..., F_in].
    y: the base projection's output, [..., *out_shape].
  """
  adapter = getattr(module, f"{name}_lora", None)
  if adapter is None:
    return y
  a = adapter.a[...].astype(x_bsf.dtype)
  b = adapter.b[...].astype(x_bsf.dtype)
  r = a.shape[-1]
  delta = dense(dense(x_bsf, a.reshape(-1, r)), b.reshape(r, -1))
  return y + (adapter.scale * delta).astype(y.dtype).reshape(y.shape)


def merged_weight(module, name):
  """The projection's weight with its LoRA update merged in, W + (α/r)·A·B, in float32
  (the weight itself, unchanged, when the module has no adapter for it)."""
  w = getattr(module, name)[...]
  adapter = getattr(module, f"{name}_lora", None)
  if adapter is None:
    return w
  a, b = adapter.a[...].astype(jnp.float32), adapter.b[...].astype(jnp.float32)
  r = a.shape[-1]
  delta = (a.reshape(-1, r) @ b.reshape(r, -1)).reshape(w.shape)
  return w.astype(jnp.float32) + adapter.scale * delta


def dense(x_bsf, w_fd):
  """x W over the last axis, as one 2-D matmul over the flattened leading axes.

  Same value and gradients as `x @ w`. Flattening first makes autodiff's weight
  gradient a plain 2-D xᵀg dot; with the batch axes kept, XLA CPU lowered it with
  transposed copies of the [B·S, F] activations (the MLP's alone were ~20 % of the
  benchmark update step; measured 37 % less CPU time for an MLP block's forward +
  backward, `benchmarks/update_roofline.py`).
  """
  lead = x_bsf.shape[:-1]
  return (x_bsf.reshape(-1, x_bsf.shape[-1]) @ w_fd).reshape(*lead, w_fd.shape[-1])


def _project_heads(x_bsd, w_dhe):
  """x W with W [D,H,Dh] -> [B,S,H,Dh], as one 2-D matmul over the flattened heads.

  Same math as einsum("bsd,dhe->bshe"); the explicit [D, H·Dh] view is a free reshape,
  whereas XLA CPU lowered the einsum (and the output projection's "bshe,hed") with a
  transposed copy of the weight on every decode step.
  """
  d, h, dh = w_dhe.shape
  return dense(x_bsd, w_dhe.reshape(d, h * dh)).reshape(*x_bsd.shape[:-1], h, dh)


def _one_query_attention(q_bkgd, k_bkdt, v_bkte, mask_bt):
  """Decode-step attention (one query per row): two batched matmuls, fp32 accumulation.

  Same math as the multi-query einsum path. With the keys stored transposed, the
  scores are a [G,Dh] x [Dh,T] matmul per (row, KV head) over contiguous memory. The
  broadcast-multiply + reduce form it replaced read the cache at ~9 GB/s: in isolation
  (8 rows, T = 128, 96 steps of one layer) 7.6 ms against 1.5 ms for this form; a whole
  batch-8 `benchmarks/sampler_vs_hf.py` call went from 76 to 68 ms (median, one process each).
  Returns [B,K,G,Dh] in the value dtype.
  """
  f32 = jnp.float32
  scores = jnp.einsum("bkgd,bkdt->bkgt", q_bkgd, k_bkdt, preferred_element_type=f32)
  scores = jnp.where(mask_bt[:, None, None, :], scores, jnp.finfo(f32).min)
  probs = jax.nn.softmax(scores, axis=-1).astype(v_bkte.dtype)
  out = jnp.einsum("bkgt,bktd->bkgd", probs, v_bkte, preferred_element_type=f32)
  return out.astype(v_bkte.dtype)


def write_cache(k_bkdt, v_bkte, new_k_bkds, new_v_bkse, start):
  """Writes S new keys/values into cache slots [start, start + S).

  `start` is a scalar (one `dynamic_update_slice` for the batch) or int [B], one first slot
  per row (rows at different decode steps: the continuous-batching sampler), written row by
  row as a vmapped update (a scatter).
  """
  k_new = new_k_bkds.astype(k_bkdt.dtype)
  v_new = new_v_bkse.astype(v_bkte.dtype)
  if jnp.ndim(start) == 0:
    return (jax.lax.dynamic_update_slice(k_bkdt, k_new, (0, 0, 0, start)),
            jax.lax.dynamic_update_slice(v_bkte, v_new, (0, 0, start, 0)))
  row_k = lambda c, x, s: jax.lax.dynamic_update_slice(c, x, (0, 0, s))  # noqa: E731
  row_v = lambda c, x, s: jax.lax.dynamic_update_slice(c, x, (0, s, 0))  # noqa: E731
  return jax.vmap(row_k)(k_bkdt, k_new, start), jax.vmap(row_v)(v_bkte, v_new, start)


class MLP(nnx.Module):
  """SwiGLU feed-forward, down(silu(x W_gate) ⊙ x W_up).

  Shazeer 2020, "GLU Variants Improve Transformer", arXiv:2002.05202, Eq. 6 (FFN_SwiGLU).
  """

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    d, f, pd = cfg.hidden_size, cfg.intermediate_size, cfg.weight_dtype
    self.dtype = cfg.compute_dtype
    self.gate = param(rngs, (d, f), ("embed", "mlp"), pd)
    self.up = param(rngs, (d, f), ("embed", "mlp"), pd)
    self.down = param(rngs, (f, d), ("mlp", "embed"), pd)

  def fused_gate_up(self):
    """gate|up as one [D, 2F] matrix, for decoding (see `Attention.qkv`); LoRA merged in."""
    return jnp.concatenate([merged_weight(self, "gate"), merged_weight(self, "up")],
                           axis=1).astype(self.dtype)

  def __call__(self, x_bsd, gate_up=None):
    dt = self.dtype
    if gate_up is None:
      g = with_lora(self, "gate", x_bsd, dense(x_bsd, self.gate[...].astype(dt)))  # [B,S,F]
      u = with_lora(self, "up", x_bsd, dense(x_bsd, self.up[...].astype(dt)))  # [B,S,F]
    else:
      g, u = jnp.split(dense(x_bsd, gate_up), 2, axis=-1)
    hidden = jax.nn.silu(g) * u
    return with_lora(self, "down", hidden, dense(hidden, self.down[...].astype(dt)))  # [B,S,D]


class DecoderLayer(nnx.Module):
  """Pre-norm block: x + Attn(norm(x)), then x + MLP(norm(x))."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    pd = cfg.weight_dtype
    self.attn_norm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps, rngs=rngs, param_dtype=pd)
    self.attn = Attention(cfg, rngs=rngs)
    self.mlp_norm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps, rngs=rngs, param_dtype=pd)
    self.mlp = MLP(cfg, rngs=rngs)

  def __call__(self, x_bsd, cos, sin, mask_bst):
    """Full (uncached) block over S tokens; mask_bst [B,S,S] bool."""
    q, k, v = self.attn.qkv(self.attn_norm(x_bsd), cos, sin)
    x_bsd = x_bsd + self.attn.attend(q, k.transpose(0, 2, 3, 1), v.swapaxes(1, 2), mask_bst)
    return x_bsd + self.mlp(self.mlp_norm(x_bsd))

  def fused_weights(self):
    """(fused q|k|v weight, its bias or None, fused gate|up weight), for `cached`."""
    return (*self.attn.fused_qkv(), self.mlp.fused_gate_up())

  def cached(self, x_bsd, cos, sin, mask_bst, k_bkdt, v_bkte, start, fused=None):
    """Block over S new tokens that writes their K/V into slots [start, start+S) (`start`
    a scalar, or int [B] for a different first slot per row).

    Args:
      k_bkdt, v_bkte: this layer's cache, keys [B,K,Dh,S_max], values [B,K,S_max,Dh].
      mask_bst: [B,S,S_max] bool.
      fused: optional `fused_weights()`, computed once outside a decode loop.
    Returns:
      (x [B,S,D], k_bkdt, v_bkte) with the new slots written.
    """
    q, k, v = self.attn.qkv(self.attn_norm(x_bsd), cos, sin,
                            fused=None if fused is None else fused[:2])
    k_bkdt, v_bkte = write_cache(k_bkdt, v_bkte, k.transpose(0, 2, 3, 1), v.swapaxes(1, 2),
                                 start)
    keys = k_bkdt
    if x_bsd.shape[1] > 1 and keys.dtype != jnp.float32:
      # Prefill: XLA CPU has no bf16 x bf16 -> f32 kernel for this batched dot with the
      # keys in the cache's transposed layout; upcast (once per prompt, not per step).
      q, keys = q.astype(jnp.float32), keys.astype(jnp.float32)
    x_bsd = x_bsd + self.attn.attend(q, keys, v_bkte, mask_bst).astype(x_bsd.dtype)
    gate_up = None if fused is None else fused[2]
    return x_bsd + self.mlp(self.mlp_norm(x_bsd), gate_up), k_bkdt, v_bkte
