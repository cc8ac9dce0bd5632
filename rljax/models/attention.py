"""Grouped-query attention: the projections, the full (training) and cached (decoding)
attention, and the KV-cache writes.

Every parameter carries logical axis names in its `out_sharding` metadata (see
`rljax.models.layers`); no mesh axis is named here.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
from flax import nnx

from rljax.models.attention_chunked import chunked_attention
from rljax.models.attention_kernels import AttentionMask, attend_blocks, resolve_attention
from rljax.models.config import ModelConfig
from rljax.models.layers import (
  apply_rope,
  dense,
  dense_heads,
  flat_rows,
  merged_weight,
  param,
  with_lora,
)
from rljax.models.norm import RMSNorm


class Attention(nnx.Module):
  """Causal grouped-query attention with RoPE, optional q/k bias and q/k RMSNorm.

  Vaswani et al. 2017, "Attention Is All You Need", arXiv:1706.03762, Eq. 1;
  grouped-query attention: Ainslie et al. 2023, arXiv:2305.13245 (Sec. 2.2).

  How a block of more than one query attends is `cfg.attention`
  (`rljax.models.attention_kernels`): `xla` materialises the scores (below); `chunked`,
  `splash` and `cudnn` never build a [B,S,T] array, and give the same values on every query
  that sees a key.

  Note: K/V heads are never repeated; queries are reshaped to [B,S,K,G,Dh] and
  attend to their group's K/V head. Softmax runs in float32; masked scores are set to
  the float32 minimum, so a fully masked query row (a left-padding token) gives a finite
  (uniform) output on the xla path, 0 or another finite value on the others; such rows
  are never read.
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
      # flattened once for the three: each its own reshape, autodiff kept three copies of
      # the same [B·S, D] input for the backward (`rljax.models.layers.flat_rows`)
      x_nd = flat_rows(x_bsd)
      q, k, v = (with_lora(self, name, x_nd, _project_heads(x_nd, getattr(self, name)[...]
                                                             .astype(dt)))
                 .reshape(*x_bsd.shape[:-1], -1, self.cfg.head_dim) for name in "qkv")
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

  def attention_impl(self, q_len: int, kv_len: int) -> str:
    """The implementation `cfg.attention` stands for at this block's shape
    (`rljax.models.attention_kernels.resolve_attention`)."""
    return resolve_attention(self.cfg.attention, q_len=q_len, kv_len=kv_len,
                             dtype=self.cfg.compute_dtype)

  def attend(self, q_bshe, k_bkdt, v_bkte, mask: AttentionMask, new_kv=None):
    """Softmax(q kᵀ / sqrt(Dh) + mask) v over a KV cache (decode steps, prefill), then the
    output projection -> [B,S,D]. Uncached blocks use `attend_full` (same math).

    A decode step (S = 1) runs the one-query kernel. A longer block (prefill) runs
    `cfg.attention`: `xla` over the whole cache; any other over the new tokens' own keys
    and values `new_kv` when the block is causal from slot 0 (`mask.from_zero`), where it
    can see nothing else; otherwise (a prefill at start > 0, against an existing prefix:
    multi-turn observations) `chunked` over the cache, the one path that takes the cache's
    slots and a start per row.

    Args:
      q_bshe: queries [B,S,H,Dh].
      k_bkdt: keys [B,K,Dh,T], transposed (the KV-cache layout): q kᵀ is then a plain
        [G,Dh] x [Dh,T] matmul per (row, KV head), read in place.
      v_bkte: values [B,K,T,Dh].
      mask: an `AttentionMask` over the T slots.
      new_kv: optional (keys, values) [B,S,K,Dh] of the S new tokens.
    """
    b, s, h, dh = q_bshe.shape
    kh, t = k_bkdt.shape[1], k_bkdt.shape[3]
    fresh = mask.causal and mask.from_zero and new_kv is not None   # sees slots < S only
    impl = self.attention_impl(s, s if fresh else t)
    scale = jnp.asarray(dh ** -0.5, q_bshe.dtype)
    if s > 1 and impl != "xla":
      if fresh:
        out = attend_blocks(impl, q_bshe * scale, *new_kv, mask.prefix(s))
      else:
        out = chunked_attention(q_bshe * scale, k_bkdt.swapaxes(2, 3), v_bkte, mask.kv_valid,
                                mask.start, causal=mask.causal)
      return self.project_out(out)
    mask_bst = mask.dense(s)
    if s > 1 and k_bkdt.dtype != jnp.float32:
      # XLA CPU has no bf16 x bf16 -> f32 kernel for this batched dot with the keys in the
      # cache's transposed layout; upcast (once per prompt, not per step).
      q_bshe, k_bkdt = q_bshe.astype(jnp.float32), k_bkdt.astype(jnp.float32)
    q = q_bshe.reshape(b, s, kh, h // kh, dh) * jnp.asarray(dh ** -0.5, q_bshe.dtype)
    if s == 1:
      out = _one_query_attention(q[:, 0], k_bkdt, v_bkte, mask_bst[:, 0]).reshape(b, s, h, dh)
    else:
      scores = jnp.einsum("bskgd,bkdt->bkgst", q, k_bkdt,
                          preferred_element_type=jnp.float32)  # [B,K,G,S,T]
      probs = masked_softmax(scores, mask_bst[:, None, None], v_bkte.dtype)
      out = jnp.einsum("bkgst,bktd->bskgd", probs, v_bkte).reshape(b, s, h, dh)
    return self.project_out(out)

  def attend_full(self, q_bshe, k_bske, v_bske, mask: AttentionMask):
    """`attend` for an uncached block (training, scoring): keys and values as the
    projections wrote them, [B,T,K,Dh], by `cfg.attention`.

    Same math as `attend`. On the `xla` path the queries of a KV head's group are stacked
    into one [G·S, Dh] matrix and the scores computed as q kᵀ with both operands
    contracted on their minor axis, so XLA CPU writes them in the [B,K,G·S,T] layout the
    softmax reads; with the cache's transposed keys it computed k qᵀ and then transposed
    every layer's [B,K,G,S,T] scores (and wrote the queries out in two layouts).
    """
    b, s, h, dh = q_bshe.shape
    t, kh = k_bske.shape[1], k_bske.shape[2]
    impl = self.attention_impl(s, t)
    if impl != "xla":
      q = q_bshe * jnp.asarray(dh ** -0.5, q_bshe.dtype)
      return self.project_out(attend_blocks(impl, q, k_bske, v_bske, mask))
    g = h // kh
    mask_bst = mask.dense(s)
    chex.assert_shape(mask_bst, (b, s, t))
    q = q_bshe.reshape(b, s, kh, g, dh).transpose(0, 2, 3, 1, 4).reshape(b, kh, g * s, dh)
    q = q * jnp.asarray(dh ** -0.5, q.dtype)
    scores = jnp.einsum("bkqd,btkd->bkqt", q, k_bske,
                        preferred_element_type=jnp.float32)  # [B,K,G·S,T]
    mask = jnp.broadcast_to(mask_bst[:, None, None], (b, 1, g, s, t)).reshape(b, 1, g * s, t)
    probs = masked_softmax(scores, mask, v_bske.dtype)
    out = jnp.einsum("bkqt,btkd->bkqd", probs, v_bske)  # [B,K,G·S,Dh]
    return self.project_out(out.reshape(b, kh, g, s, dh).transpose(0, 3, 1, 2, 4)
                            .reshape(b, s, h, dh))

  def project_out(self, out_bshe):
    """The output projection (and bias) of the heads' outputs [B,S,H,Dh] -> [B,S,D]."""
    b, s, h, dh = out_bshe.shape
    dt = self.cfg.compute_dtype
    out_nf = out_bshe.reshape(b * s, h * dh)
    y = with_lora(self, "o", out_nf, dense_heads(out_nf, self.o[...].astype(dt)))
    y = y.reshape(b, s, -1)
    if self.cfg.attention_out_bias:
      y = y + self.o_bias[...].astype(dt)
    return y


def _project_heads(x_bsd, w_dhe):
  """x W with W [D,H,Dh] -> [B,S,H,Dh], as one 2-D matmul over the flattened heads.

  Same math as einsum("bsd,dhe->bshe"); the explicit [D, H·Dh] view is a free reshape,
  whereas XLA CPU lowered the einsum (and the output projection's "bshe,hed") with a
  transposed copy of the weight on every decode step.
  """
  d, h, dh = w_dhe.shape
  return dense_heads(flat_rows(x_bsd), w_dhe).reshape(*x_bsd.shape[:-1], h, dh)


def masked_softmax(scores, mask, dtype):
  """Softmax over the last axis of float32 `scores` where `mask` (broadcast) is True, cast to
  `dtype`. Masked scores are set to the float32 minimum, not -inf, so a fully masked row
  gives a finite (uniform) distribution."""
  scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
  return softmax_saving_output(scores).astype(dtype)


@jax.custom_vjp
def softmax_saving_output(x):
  """`jax.nn.softmax(x, axis=-1)` whose backward keeps only the output y:
  dx = y ⊙ (dy − Σ_j dy_j y_j), the softmax Jacobian-vector product.

  JAX differentiates `jax.nn.softmax` through its max, exp, sum and division (unless
  `jax_softmax_custom_jvp` is set) and keeps exp(x − max) beside y for the backward: two
  [B, H, S, T] float32 arrays per layer where one suffices (Qwen2.5-0.5B, 8 rows of 192
  tokens: 396 MB of the update's 6 GB of temporaries). Same forward values."""
  return jax.nn.softmax(x, axis=-1)


def _softmax_forward(x):
  y = jax.nn.softmax(x, axis=-1)
  return y, y


def _softmax_backward(y, dy):
  return (y * (dy - jnp.sum(dy * y, axis=-1, keepdims=True)),)


softmax_saving_output.defvjp(_softmax_forward, _softmax_backward)


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
  probs = masked_softmax(scores, mask_bt[:, None, None, :], v_bkte.dtype)
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
