"""Decoder-only transformer (Llama / Qwen2 / Qwen3, and Qwen3-MoE / Qwen2-MoE) in Flax NNX,
with an explicit KV cache: the stack (`Decoder`) of pre-norm blocks (`rljax.models.block`)."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
from flax import nnx

from rljax.models.attention_kernels import AttentionMask
from rljax.models.block import DecoderLayer, KVCache
from rljax.models.config import ModelConfig
from rljax.models.layers import param, rope_cos_sin
from rljax.models.moe import Routing
from rljax.models.norm import RMSNorm
from rljax.models.stack import LayerStack, call_layer

FEW_ROWS = 64   # `Decoder.few_row_logits` flips a tied lm head up to this many rows

__all__ = ["Decoder", "DecoderLayer", "KVCache", "positions_from_mask"]


def positions_from_mask(attention_mask_bs):
  """RoPE positions for a (left- or right-) padded batch: cumsum(mask) - 1, clipped at 0.

  Real tokens get 0, 1, 2, ... whatever the padding (as in `transformers` generate); padding
  slots get the nearest earlier real token's (0 for left padding; outputs never used).

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
  RMSNorm respectively; layer i has a mixture-of-experts MLP when `cfg.is_moe_layer(i)`
  (Qwen3-MoE / Qwen2-MoE, `rljax.models.moe`).

  Attention always takes explicit `positions` and an `attention_mask`, so left-padded
  batches give the same outputs on their real tokens as unpadded ones.

  `layers` is the list of blocks: with `cfg.scan_layers` one `LayerStack` per run of
  identical consecutive blocks (dense or MoE; a dense model has one; each run is one scan
  over stacked parameters, `rljax.models.stack`), else L `DecoderLayer`s. Both are
  initialised with the same values (a stack stacks freshly built blocks, so building one
  with random weights holds both copies for a moment; `load_hf` builds it abstractly).

  Routing (MoE layers): `routed`, `hidden_states_routed` and the `*_cached_routed` forwards
  also return the routing of every MoE layer, a `rljax.models.moe.Routing` whose arrays
  have a leading axis of the L_moe MoE layers in order ([L_moe, B, S, k] ids); `replay_ids`
  [L_moe, B, S, k] makes the full forwards use those experts (routing replay).
  """

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    pd = cfg.weight_dtype
    self.embed = param(rngs, (cfg.vocab_size, cfg.hidden_size), ("vocab", "embed"), pd)
    blocks = [DecoderLayer(cfg, rngs=rngs, moe=cfg.is_moe_layer(i))
              for i in range(cfg.num_layers)]
    if cfg.scan_layers:
      runs = []
      for block in blocks:   # runs of identical consecutive blocks, one stack each
        if runs and runs[-1][-1].moe == block.moe:
          runs[-1].append(block)
        else:
          runs.append([block])
      blocks = [LayerStack(run) for run in runs]
    self.layers = nnx.List(blocks)
    self.final_norm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps, rngs=rngs, param_dtype=pd)
    if not cfg.tie_embeddings:
      self.lm_head = param(rngs, (cfg.hidden_size, cfg.vocab_size), ("embed", "vocab"), pd)

  @property
  def num_moe_layers(self) -> int:
    """L_moe, the layers with a mixture-of-experts MLP (0 for a dense model)."""
    return sum(self.cfg.is_moe_layer(i) for i in range(self.cfg.num_layers))

  def __call__(self, tokens_bs, *, positions=None, attention_mask=None, replay_ids=None):
    """Full forward without cache.

    Args:
      tokens_bs: int [B,S].
      positions: int [B,S] (RoPE positions; for left padding, count real tokens only).
        Default: cumsum(attention_mask) - 1, clipped at 0.
      attention_mask: [B,S], 1 = real token, 0 = padding. Default: all ones.
      replay_ids: optional int [L_moe,B,S,k], the experts each MoE layer uses (routing
        replay, `rljax.models.moe.route`; ids >= E: the router's own choice).
    Returns:
      logits, float32 [B,S,V].
    """
    return self.routed(tokens_bs, positions=positions, attention_mask=attention_mask,
                       replay_ids=replay_ids)[0]

  def routed(self, tokens_bs, *, positions=None, attention_mask=None, replay_ids=None):
    """`__call__` that also returns the MoE layers' routing: (logits float32 [B,S,V],
    `Routing` [L_moe, ...] or None for a dense model)."""
    hidden, routing = self.hidden_states_routed(
        tokens_bs, positions=positions, attention_mask=attention_mask, replay_ids=replay_ids)
    return self.logits_from_hidden(hidden), routing

  def embed_tokens(self, tokens_bs):
    """Token embeddings [B,S,D] in the compute dtype. Ids outside [0, V) are clipped (not
    NaN-filled, jnp.take's default): a pad id such as -1 under a zero attention mask
    cannot poison real positions with NaN."""
    return jnp.take(self.embed[...], tokens_bs, axis=0, mode="clip").astype(
        self.cfg.compute_dtype)

  def hidden_states(self, tokens_bs, *, positions=None, attention_mask=None, segment_ids=None,
                    replay_ids=None):
    """Final-normed hidden states [B,S,D] (compute dtype); same arguments as `__call__`.

    `segment_ids` [B,S] (optional): packed rows holding several sequences; a query attends
    only keys of its own segment (positions should then restart per segment).
    """
    return self.hidden_states_routed(tokens_bs, positions=positions,
                                     attention_mask=attention_mask, segment_ids=segment_ids,
                                     replay_ids=replay_ids)[0]

  def hidden_states_routed(self, tokens_bs, *, positions=None, attention_mask=None,
                           segment_ids=None, replay_ids=None):
    """`hidden_states` and the MoE layers' `Routing` [L_moe, ...] (None for a dense model)."""
    chex.assert_rank(tokens_bs, 2)
    if attention_mask is None:
      attention_mask = jnp.ones(tokens_bs.shape, jnp.int32)
    if positions is None:
      positions = positions_from_mask(attention_mask)
    chex.assert_equal_shape([tokens_bs, positions, attention_mask])
    if replay_ids is not None:
      chex.assert_shape(replay_ids, (self.num_moe_layers, *tokens_bs.shape,
                                     self.cfg.num_experts_per_tok))
    x = self.embed_tokens(tokens_bs)  # [B,S,D]
    cos, sin = rope_cos_sin(positions, self.cfg)
    if segment_ids is not None:
      chex.assert_equal_shape([tokens_bs, segment_ids])
    mask_bst = AttentionMask.full(attention_mask, segment_ids)  # [B,S,S], as [B,S] vectors
    routings, first = [], 0
    for block in self.layers:   # a DecoderLayer or a LayerStack (one scan)
      stacked = isinstance(block, LayerStack)
      moe = (block.layer if stacked else block).moe
      xs = None
      if moe and replay_ids is not None:
        xs = replay_ids[first:first + block.count] if stacked else replay_ids[first]
      out = call_layer(block, x, cos, sin, mask_bst, remat=self.cfg.remat, xs=xs)
      if moe:
        x, routing = out
        routings.append(routing if stacked else jax.tree.map(lambda a: a[None], routing))
        first += block.count if stacked else 1
      else:
        x = out
    return self.final_norm(x), _concat_layers(routings)

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

  def few_row_logits(self, hidden_bsd):
    """`logits_from_hidden` for a decode step's few rows (equal up to float rounding).

    Note: XLA CPU reads a tied lm head E [V,D] at ~27 GB/s in `h @ E.T` and at ~47 GB/s in
    `E @ h.T` transposed after an `optimization_barrier` (which keeps XLA from folding the
    transpose back); Qwen2.5-0.5B, 8 rows: 19.4 -> 11.4 ms (benchmarks/README.md). Sampler only.
    """
    rows = hidden_bsd.size // hidden_bsd.shape[-1]
    if not self.cfg.tie_embeddings or rows > FEW_ROWS:
      return self.logits_from_hidden(hidden_bsd)
    e = self.embed[...].astype(self.cfg.compute_dtype)
    h = hidden_bsd.reshape(rows, -1).astype(e.dtype)
    logits_vr = jnp.einsum("vd,rd->vr", e, h, preferred_element_type=jnp.float32)
    return jax.lax.optimization_barrier(logits_vr).T.reshape(*hidden_bsd.shape[:-1], -1)

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
    return self.hidden_cached_routed(tokens_bs, positions=positions, cache=cache, start=start,
                                     kv_mask=kv_mask, fused=fused, causal=causal)[:2]

  def hidden_cached_routed(self, tokens_bs, *, positions, cache: KVCache, start, kv_mask,
                           fused=None, causal=True):
    """`hidden_cached` and the MoE layers' `Routing` [L_moe, ...] of the S new tokens (None
    for a dense model): (hidden [B,S,D], cache, routing)."""
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
    ks, vs, routings = [], [], []
    layers = self.layer_list() if fused is None else [layer for _, layer in fused]
    for i, layer in enumerate(layers):
      x, k_i, v_i, routing = layer.cached(x, cos, sin, mask_bst, cache.k[i], cache.v[i], start,
                                          fused=None if fused is None else fused[i][0])
      ks.append(k_i)
      vs.append(v_i)
      if routing is not None:
        routings.append(jax.tree.map(lambda a: a[None], routing))
    return self.final_norm(x), KVCache(tuple(ks), tuple(vs)), _concat_layers(routings)

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
    return self.forward_cached_routed(
        tokens_bs, positions=positions, cache=cache, start=start, kv_mask=kv_mask, fused=fused,
        causal=causal)[:2]

  def forward_cached_routed(self, tokens_bs, *, positions, cache: KVCache, start, kv_mask,
                            fused=None, causal=True):
    """`forward_cached` and the MoE layers' `Routing` [L_moe, ...] of the S new tokens (None
    for a dense model): (logits float32 [B,S,V], cache, routing)."""
    hidden, cache, routing = self.hidden_cached_routed(
        tokens_bs, positions=positions, cache=cache, start=start, kv_mask=kv_mask, fused=fused,
        causal=causal)
    return self.few_row_logits(hidden), cache, routing


def _concat_layers(routings) -> Routing | None:
  """Per-block `Routing`s with a leading layer axis -> one over all of them (None if none)."""
  if not routings:
    return None
  return jax.tree.map(lambda *xs: jnp.concatenate(xs, axis=0), *routings)
