"""Decoder-only transformer (Llama / Qwen2 / Qwen3) in Flax NNX, with an explicit KV cache:
the pre-norm block (`DecoderLayer`) and the stack (`Decoder`)."""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
from flax import nnx

from rljax.models.attention import Attention, write_cache
from rljax.models.attention_kernels import AttentionMask
from rljax.models.config import ModelConfig
from rljax.models.layers import MLP, RMSNorm, param, rope_cos_sin
from rljax.models.stack import LayerStack, call_layer


class KVCache(NamedTuple):
  """Keys and values per layer in the compute dtype: k[l] [B,K,Dh,S_max], v[l] [B,K,S_max,Dh].

  Note: a tuple of L per-layer arrays, heads before time, rather than one stacked
  [L,B,S_max,K,Dh] array: slicing a layer out of a stacked array (and transposing it
  for the attention dots) copied the whole cache on every decode step; per-layer arrays
  are read in place and written with `dynamic_update_slice` (measured 1.2-2x faster
  decode at S_max 128-512 on CPU). Keys are stored transposed so that a decode step's
  q kᵀ is a plain matmul over contiguous slots (`attention._one_query_attention`).
  A scanned decoder (`ModelConfig.scan_layers`) keeps this cache and loops over its
  layers when decoding: a scan over the layers carrying one stacked cache decoded 1.2x
  (batch 64) to 1.7x (batch 8) slower (docs/performance.md, "Scanned layers").
  """

  k: tuple[jax.Array, ...]
  v: tuple[jax.Array, ...]

  @property
  def max_len(self) -> int:
    """S_max, the number of slots."""
    return self.v[0].shape[2]

  def grow(self, max_len: int) -> KVCache:
    """The same cache with zero slots appended up to `max_len` (one copy per array)."""
    extra = max_len - self.max_len
    if extra < 0:
      raise ValueError(f"cannot shrink a KV cache from {self.max_len} to {max_len} slots")
    pad_k = lambda k: jnp.pad(k, ((0, 0), (0, 0), (0, 0), (0, extra)))
    pad_v = lambda v: jnp.pad(v, ((0, 0), (0, 0), (0, extra), (0, 0)))
    return KVCache(tuple(map(pad_k, self.k)), tuple(map(pad_v, self.v)))


class DecoderLayer(nnx.Module):
  """Pre-norm block: x + Attn(norm(x)), then x + MLP(norm(x))."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    pd = cfg.weight_dtype
    self.attn_norm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps, rngs=rngs, param_dtype=pd)
    self.attn = Attention(cfg, rngs=rngs)
    self.mlp_norm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps, rngs=rngs, param_dtype=pd)
    self.mlp = MLP(cfg, rngs=rngs)

  def __call__(self, x_bsd, cos, sin, mask_bst: AttentionMask):
    """Full (uncached) block over S tokens; `mask_bst` the [B,S,S] mask as per-token vectors
    (`AttentionMask.full`)."""
    q, k, v = self.attn.qkv(self.attn_norm(x_bsd), cos, sin)
    x_bsd = x_bsd + self.attn.attend_full(q, k, v, mask_bst)
    return x_bsd + self.mlp(self.mlp_norm(x_bsd))

  def fused_weights(self):
    """(fused q|k|v weight, its bias or None, fused gate|up weight), for `cached`."""
    return (*self.attn.fused_qkv(), self.mlp.fused_gate_up())

  def cached(self, x_bsd, cos, sin, mask_bst, k_bkdt, v_bkte, start, fused=None):
    """Block over S new tokens that writes their K/V into slots [start, start+S) (`start`
    a scalar, or int [B] for a different first slot per row).

    Args:
      k_bkdt, v_bkte: this layer's cache, keys [B,K,Dh,S_max], values [B,K,S_max,Dh].
      mask_bst: the [B,S,S_max] mask as per-token vectors (`AttentionMask.cached`).
      fused: optional `fused_weights()`, computed once outside a decode loop.
    Returns:
      (x [B,S,D], k_bkdt, v_bkte) with the new slots written.
    """
    q, k, v = self.attn.qkv(self.attn_norm(x_bsd), cos, sin,
                            fused=None if fused is None else fused[:2])
    k_bkdt, v_bkte = write_cache(k_bkdt, v_bkte, k.transpose(0, 2, 3, 1), v.swapaxes(1, 2),
                                 start)
    x_bsd = x_bsd + self.attn.attend(q, k_bkdt, v_bkte, mask_bst, new_kv=(k, v)).astype(
        x_bsd.dtype)
    gate_up = None if fused is None else fused[2]
    return x_bsd + self.mlp(self.mlp_norm(x_bsd), gate_up), k_bkdt, v_bkte


def positions_from_mask(attention_mask_bs):
  """RoPE positions for a (left- or right-) padded batch: cumsum(mask) - 1, clipped at 0.

  Real tokens get 0, 1, 2, ... whatever the padding (as in `transformers` generate);
  padding slots get the position of the nearest real token before them (0 for left
  padding; their outputs are never used). The default of `Decoder.__call__`.

  Args:
    attention_mask_bs: [B,S], 1 = real token.
  Returns:
    int32 [B,S].
  """
  return jnp.maximum(jnp.cumsum(attention_mask_bs > 0, axis=1, dtype=jnp.int32) - 1, 0)


class Decoder(nnx.Module):
  """Token embedding, L pre-norm blocks, final RMSNorm, lm head (tied or untied).

  Touvron et al. 2023, "LLaMA: Open and Efficient Foundation Language Models",
  arXiv:2302.13971 (Sec. 2.2: pre-normalisation with RMSNorm, SwiGLU, RoPE); the Qwen2
  (arXiv:2407.10671) and Qwen3 (arXiv:2505.09388) variants add q/k/v biases and q/k
  RMSNorm respectively.

  Attention always takes explicit `positions` and an `attention_mask`, so left-padded
  batches give the same outputs on their real tokens as unpadded ones.

  `layers` is the list of blocks: with `cfg.scan_layers` one `LayerStack` of the L blocks
  (run as one scan over stacked parameters, `rljax.models.stack`), else L `DecoderLayer`s.
  Both are initialised with the same values (the stack stacks L freshly built blocks, so
  building one with random weights holds both copies for a moment; `load_hf` builds it
  abstractly).
  """

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    pd = cfg.weight_dtype
    self.embed = param(rngs, (cfg.vocab_size, cfg.hidden_size), ("vocab", "embed"), pd)
    blocks = [DecoderLayer(cfg, rngs=rngs) for _ in range(cfg.num_layers)]
    self.layers = nnx.List([LayerStack(blocks)] if cfg.scan_layers else blocks)
    self.final_norm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps, rngs=rngs, param_dtype=pd)
    if not cfg.tie_embeddings:
      self.lm_head = param(rngs, (cfg.hidden_size, cfg.vocab_size), ("embed", "vocab"), pd)

  def __call__(self, tokens_bs, *, positions=None, attention_mask=None):
    """Full forward without cache.

    Args:
      tokens_bs: int [B,S].
      positions: int [B,S] (RoPE positions; for left padding, count real tokens only).
        Default: cumsum(attention_mask) - 1, clipped at 0.
      attention_mask: [B,S], 1 = real token, 0 = padding. Default: all ones.
    Returns:
      logits, float32 [B,S,V].
    """
    hidden = self.hidden_states(tokens_bs, positions=positions, attention_mask=attention_mask)
    return self.logits_from_hidden(hidden)

  def embed_tokens(self, tokens_bs):
    """Token embeddings [B,S,D] in the compute dtype.

    Note: ids outside [0, V) are clipped (not NaN-filled, jnp.take's default), so a pad
    id such as -1 under a zero attention mask cannot poison real positions with NaN.
    """
    return jnp.take(self.embed[...], tokens_bs, axis=0, mode="clip").astype(
        self.cfg.compute_dtype)

  def hidden_states(self, tokens_bs, *, positions=None, attention_mask=None, segment_ids=None):
    """Final-normed hidden states [B,S,D] (compute dtype); same arguments as `__call__`.

    `segment_ids` [B,S] (optional): packed rows holding several sequences; a query attends
    only keys of its own segment (positions should then restart per segment).
    """
    chex.assert_rank(tokens_bs, 2)
    if attention_mask is None:
      attention_mask = jnp.ones(tokens_bs.shape, jnp.int32)
    if positions is None:
      positions = positions_from_mask(attention_mask)
    chex.assert_equal_shape([tokens_bs, positions, attention_mask])
    x = self.embed_tokens(tokens_bs)  # [B,S,D]
    cos, sin = rope_cos_sin(positions, self.cfg)
    if segment_ids is not None:
      chex.assert_equal_shape([tokens_bs, segment_ids])
    mask_bst = AttentionMask.full(attention_mask, segment_ids)  # [B,S,S], as [B,S] vectors
    for block in self.layers:   # a DecoderLayer or a LayerStack (one scan)
      x = call_layer(block, x, cos, sin, mask_bst, remat=self.cfg.remat)
    return self.final_norm(x)

  def layer_list(self) -> list[DecoderLayer]:
    """The L blocks in order as modules: a stack's layers as slices of its parameters."""
    return [layer for block in self.layers
            for layer in (block.layers() if isinstance(block, LayerStack) else [block])]

  def locate_layer(self, i: int) -> tuple[DecoderLayer, int | None]:
    """(the module holding block i's parameters, i's index on their leading "layers" axis,
    or None when the module is block i itself)."""
    first = 0
    for block in self.layers:
      count = block.count if isinstance(block, LayerStack) else 1
      if i < first + count:
        return (block.layer, i - first) if isinstance(block, LayerStack) else (block, None)
      first += count
    raise IndexError(f"layer {i} of a {first}-layer decoder")

  def lm_head_matrix(self):
    """The output projection as [D,V] (the transposed embedding when tied)."""
    return self.embed[...].T if self.cfg.tie_embeddings else self.lm_head[...]

  def logits_from_hidden(self, hidden_bsd):
    """lm head: [..., D] hidden -> float32 [..., V] logits (matmul in the compute dtype)."""
    w = self.lm_head_matrix().astype(self.cfg.compute_dtype)
    return jnp.einsum("...d,dv->...v", hidden_bsd.astype(w.dtype), w,
                      preferred_element_type=jnp.float32)

  def init_cache(self, batch_size: int, max_len: int) -> KVCache:
    """Zero KV cache for `batch_size` sequences of up to `max_len` tokens."""
    c = self.cfg
    zeros = lambda *shape: tuple(
        jnp.zeros(shape, c.compute_dtype) for _ in range(c.num_layers))
    return KVCache(k=zeros(batch_size, c.num_kv_heads, c.head_dim, max_len),
                   v=zeros(batch_size, c.num_kv_heads, max_len, c.head_dim))

  def fused_weights(self):
    """Per layer, (the q|k|v and gate|up projections concatenated, `DecoderLayer.fused_weights`;
    the layer as its own module).

    Compute once before a decode loop and pass as `fused=` to `forward_cached`: the
    values are unchanged, a few-row decode step runs two matmuls per layer fewer.

    Note: a `LayerStack`'s layers are slices of its stacked parameters, taken here, once
    per loop: sliced inside the decode step, XLA CPU copied them at every step (measured
    1.3-1.4x slower batch-8 decode than one module per layer; sliced here, the same speed).
    The slices the step still reads (o, down, the norms; q|k|v and gate|up are read
    fused) then sit beside the stack for the loop's duration, about a third of its bytes.
    """
    return tuple((layer.fused_weights(), layer) for layer in self.layer_list())

  def hidden_cached(self, tokens_bs, *, positions, cache: KVCache, start, kv_mask, fused=None,
                    causal=True):
    """Like `forward_cached` but returns final-normed hidden states [B,S,D] instead of logits.

    Useful for prefill, where only the last position needs the lm head.
    """
    chex.assert_rank(tokens_bs, 2)
    chex.assert_equal_shape([tokens_bs, positions])
    b = tokens_bs.shape[0]
    s_max = cache.max_len
    chex.assert_shape(kv_mask, (b, s_max))
    want_k = (b, self.cfg.num_kv_heads, self.cfg.head_dim, s_max)
    if cache.k[0].shape != want_k:
      raise ValueError(f"KVCache keys must be [B,K,Dh,S_max] = {want_k} (stored transposed; "
                       f"build caches with Decoder.init_cache), got {cache.k[0].shape}")
    x = self.embed_tokens(tokens_bs)  # [B,S,D]
    cos, sin = rope_cos_sin(positions, self.cfg)
    mask_bst = AttentionMask.cached(kv_mask, start, causal=causal)  # [B,S,S_max], as vectors
    ks, vs = [], []
    layers = self.layer_list() if fused is None else [layer for _, layer in fused]
    for i, layer in enumerate(layers):
      x, k_i, v_i = layer.cached(x, cos, sin, mask_bst, cache.k[i], cache.v[i], start,
                                 fused=None if fused is None else fused[i][0])
      ks.append(k_i)
      vs.append(v_i)
    return self.final_norm(x), KVCache(tuple(ks), tuple(vs))

  def forward_cached(self, tokens_bs, *, positions, cache: KVCache, start, kv_mask,
                     fused=None, causal=True):
    """Forward S new tokens against a KV cache (prefill: S = prompt length; decode: S = 1).

    Writes K/V of the new tokens into slots [start, start+S); query i attends slot j
    iff kv_mask[b, j] and j <= start + i.

    Args:
      tokens_bs: int [B,S].
      positions: int [B,S].
      cache: `KVCache`, k[l] [B,K,Dh,S_max] and v[l] [B,K,S_max,Dh] for each of the L layers.
      start: int scalar (may be traced), first slot written; or int [B], a first slot per
        row (rows at different steps, as in the continuous-batching sampler).
      kv_mask: [B,S_max], 1 = slot holds a real token (including the new ones).
      fused: optional `fused_weights()` (same values, faster few-row steps).
      causal: False drops the `j <= start + i` condition, so `kv_mask` alone says which
        slots a query sees (slots in any order, e.g. a ring buffer: RoPE already encodes
        each key's position).
    Returns:
      (logits float32 [B,S,V], updated cache).
    """
    hidden, cache = self.hidden_cached(
        tokens_bs, positions=positions, cache=cache, start=start, kv_mask=kv_mask, fused=fused,
        causal=causal)
    return self.logits_from_hidden(hidden), cache
