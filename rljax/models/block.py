"""The decoder's pre-norm block (`DecoderLayer`: attention, then a dense or a
mixture-of-experts MLP) and its KV cache (`KVCache`)."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from rljax.models.attention import Attention, write_cache
from rljax.models.attention_kernels import AttentionMask
from rljax.models.config import ModelConfig
from rljax.models.layers import MLP
from rljax.models.moe import MoEMLP
from rljax.models.norm import RMSNorm


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
  """Pre-norm block: x + Attn(norm(x)), then x + MLP(norm(x)).

  With `moe` the MLP is a `rljax.models.moe.MoEMLP` (Qwen3-MoE's sparse block) and the
  block also returns its routing: `__call__` gives (x, `Routing`) and `cached` its routing
  as a fourth output; a dense block returns x (and None).
  """

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, moe: bool = False):
    pd = cfg.weight_dtype
    self.moe = bool(moe)
    self.attn_norm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps, rngs=rngs, param_dtype=pd)
    self.attn = Attention(cfg, rngs=rngs)
    self.mlp_norm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps, rngs=rngs, param_dtype=pd)
    self.mlp = MoEMLP(cfg, rngs=rngs) if self.moe else MLP(cfg, rngs=rngs)

  def __call__(self, x_bsd, cos, sin, mask_bst: AttentionMask, replay_ids=None):
    """Full (uncached) block over S tokens; `mask_bst` the [B,S,S] mask as per-token vectors
    (`AttentionMask.full`); `replay_ids` int [B,S,k] (MoE blocks only: the experts to use,
    routing replay). Returns x [B,S,D], or (x, `Routing`) for a MoE block."""
    q, k, v = self.attn.qkv(self.attn_norm(x_bsd), cos, sin)
    x_bsd = x_bsd + self.attn.attend_full(q, k, v, mask_bst)
    if not self.moe:
      return x_bsd + self.mlp(self.mlp_norm(x_bsd))
    y, routing = self.mlp(self.mlp_norm(x_bsd), replay_ids)
    return x_bsd + y, routing

  def fused_weights(self):
    """(fused q|k|v weight, its bias or None, fused gate|up weight or None for a MoE
    block), for `cached`."""
    return (*self.attn.fused_qkv(), None if self.moe else self.mlp.fused_gate_up())

  def cached(self, x_bsd, cos, sin, mask_bst, k_bkdt, v_bkte, start, fused=None):
    """Block over S new tokens that writes their K/V into slots [start, start+S) (`start`
    a scalar, or int [B] for a different first slot per row).

    Args:
      k_bkdt, v_bkte: this layer's cache, keys [B,K,Dh,S_max], values [B,K,S_max,Dh].
      mask_bst: the [B,S,S_max] mask as per-token vectors (`AttentionMask.cached`).
      fused: optional `fused_weights()`, computed once outside a decode loop.
    Returns:
      (x [B,S,D], k_bkdt, v_bkte with the new slots written, the MoE block's `Routing` of
      the S tokens or None).
    """
    q, k, v = self.attn.qkv(self.attn_norm(x_bsd), cos, sin,
                            fused=None if fused is None else fused[:2])
    k_bkdt, v_bkte = write_cache(k_bkdt, v_bkte, k.transpose(0, 2, 3, 1), v.swapaxes(1, 2),
                                 start)
    x_bsd = x_bsd + self.attn.attend(q, k_bkdt, v_bkte, mask_bst, new_kv=(k, v)).astype(
        x_bsd.dtype)
    if self.moe:
      y, routing = self.mlp(self.mlp_norm(x_bsd))
      return x_bsd + y, k_bkdt, v_bkte, routing
    gate_up = None if fused is None else fused[2]
    return x_bsd + self.mlp(self.mlp_norm(x_bsd), gate_up), k_bkdt, v_bkte, None
