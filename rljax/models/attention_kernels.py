"""The attention implementations behind `ModelConfig.attention` and the mask they share.

`xla` materialises the scores (`rljax.models.attention`); the others never build a
[B,S,T] array:

- `chunked`: query x key tiles with an online softmax in plain XLA, any device
  (`rljax.models.attention_chunked`);
- `splash`: Pallas splash attention on TPU (`jax.experimental.pallas.ops.tpu.splash_attention`);
- `cudnn`: cuDNN's fused attention on GPU (`jax.nn.dot_product_attention`);
- `auto`: splash on TPU (under `jax.set_mesh` when there are several devices), cudnn on
  GPU (bf16 / f16 compute), otherwise xla up to
  `AUTO_XLA_MAX_SCORES` query x key pairs per row (S = 256) and chunked beyond
  (`resolve_attention`).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu import splash_attention as splash
from jax.sharding import NamedSharding, PartitionSpec

from rljax.models.attention_chunked import chunked_attention
from rljax.models.config import ATTENTION_IMPLEMENTATIONS
from rljax.parallel.mesh import BATCH_AXES

# `auto` on CPU (and GPU without bf16): xla up to this many query x key pairs per row, chunked
# beyond. `benchmarks/attention_memory.py --speed` (value-and-grad of attention alone, B = 8,
# 4 heads of 32, 2 KV heads, the two timed in turn, load 12-14): chunked / xla time 0.8 at
# S = 128, 1.0 at 256, 0.49 at 384, 0.47 at 512, 0.26 at 1,024. Up to S = 256 xla costs no
# more and keeps the numbers the tests and golden runs recorded; beyond, chunked is faster.
AUTO_XLA_MAX_SCORES = 256 * 256
SPLASH_LANES = 128   # splash's tiles are multiples of the TPU's 128 lanes


@functools.partial(jax.tree_util.register_dataclass,
                   data_fields=["kv_valid", "start", "segment_ids"],
                   meta_fields=["causal", "from_zero"])
@dataclasses.dataclass(frozen=True)
class AttentionMask:
  """Which keys each query sees, as per-token vectors (a [B,S,T] mask never exists).

  Query i of row b sits at slot start[b] + i. It sees key slot t iff kv_valid[b, t], and
  t <= start[b] + i when `causal`, and segment_ids[b, i] == segment_ids[b, t] when given.

  Attributes:
    kv_valid: bool [B,T], True = the slot holds a real token.
    start: int [B], the slot of each row's first query.
    segment_ids: None or int [B,T] (packed rows; the queries are the keys, S == T).
    causal: static.
    from_zero: static: the queries are slots 0..S-1 (an uncached block or a prefill at
      start 0), so a causal query sees no key beyond slot S-1.
  """

  kv_valid: jax.Array
  start: jax.Array
  segment_ids: jax.Array | None = None
  causal: bool = True
  from_zero: bool = True

  @classmethod
  def full(cls, attention_mask_bs, segment_ids_bs=None) -> AttentionMask:
    """Causal self-attention over S tokens (`attention_mask` 1 = real token)."""
    b = attention_mask_bs.shape[0]
    return cls(attention_mask_bs > 0, jnp.zeros((b,), jnp.int32), segment_ids_bs)

  @classmethod
  def cached(cls, kv_mask_bt, start, *, causal: bool) -> AttentionMask:
    """Queries written at slots start + i of a KV cache whose real slots are `kv_mask`."""
    start_b = jnp.broadcast_to(jnp.asarray(start, jnp.int32), kv_mask_bt.shape[:1])
    from_zero = isinstance(start, int) and start == 0
    return cls(kv_mask_bt > 0, start_b, None, causal, from_zero)

  def dense(self, s: int):
    """The mask as bool [B,S,T] (the `xla` path)."""
    t = self.kv_valid.shape[1]
    mask = jnp.broadcast_to(self.kv_valid[:, None, :], (self.kv_valid.shape[0], s, t))
    if self.causal:
      mask = mask & (jnp.arange(t) <= (self.start[:, None] + jnp.arange(s))[:, :, None])
    if self.segment_ids is not None:
      mask = mask & (self.segment_ids[:, :, None] == self.segment_ids[:, None, :])
    return mask

  def prefix(self, s: int) -> AttentionMask:
    """The mask over the first S key slots: all a causal `from_zero` block can see."""
    seg = None if self.segment_ids is None else self.segment_ids[:, :s]
    return dataclasses.replace(self, kv_valid=self.kv_valid[:, :s], segment_ids=seg)


def target_platform() -> str:
  """The platform being compiled for: that of the mesh set with `jax.set_mesh` (an
  ahead-of-time TPU topology on a CPU host, say), else the default backend's."""
  device = jax.sharding.get_abstract_mesh().abstract_device
  return device.platform if device is not None else jax.default_backend()


def resolve_attention(name: str, *, q_len: int, kv_len: int, dtype, platform=None) -> str:
  """The implementation `name` stands for: itself, or what `auto` picks for this block.

  `auto`: splash on TPU (when the devices' mesh is set with `jax.set_mesh`, or there is one
  device: XLA cannot partition a Pallas call, so on several devices it runs per shard in a
  `shard_map` over that mesh; without one, chunked); cudnn on GPU with bf16 / f16 compute
  (cuDNN's fused kernel takes no float32); elsewhere xla while q_len x kv_len <=
  `AUTO_XLA_MAX_SCORES`, else chunked.
  """
  if name not in ATTENTION_IMPLEMENTATIONS:
    raise ValueError(f"attention={name!r}; allowed: {ATTENTION_IMPLEMENTATIONS}")
  if name != "auto":
    return name
  platform = platform or target_platform()
  if platform == "tpu":
    mesh_known = not jax.sharding.get_abstract_mesh().empty or jax.device_count() == 1
    return "splash" if mesh_known else "chunked"
  if platform == "gpu" and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16):
    return "cudnn"
  return "xla" if q_len * kv_len <= AUTO_XLA_MAX_SCORES else "chunked"


def attend_blocks(impl: str, q_bshd, k_bskd, v_bskd, mask: AttentionMask, *, interpret=None):
  """Attention of S queries over S keys/values (`mask.from_zero`) by `impl` (not xla).

  Args:
    impl: "chunked", "splash" or "cudnn". Splash needs a causal mask, cudnn a causal mask
      without segment ids; otherwise they fall back to chunked.
    q_bshd: queries [B,S,H,Dh], already scaled by 1/sqrt(Dh).
    k_bskd, v_bskd: [B,S,K,Dh], as the projections wrote them.
    interpret: splash in Pallas interpret mode (default: off TPU only).
  Returns:
    [B,S,H,Dh] in the value dtype; rows of queries that see no key are unspecified.
  """
  if impl == "splash" and mask.causal:
    interpret = target_platform() != "tpu" if interpret is None else interpret
    return splash_attention(q_bshd, k_bskd, v_bskd, mask.kv_valid, mask.segment_ids,
                            interpret=interpret)
  if impl == "cudnn" and mask.causal and mask.segment_ids is None:
    return cudnn_attention(q_bshd, k_bskd, v_bskd, mask.kv_valid)
  seg = None if mask.segment_ids is None else (mask.segment_ids, mask.segment_ids)
  return chunked_attention(q_bshd, k_bskd.swapaxes(1, 2), v_bskd.swapaxes(1, 2), mask.kv_valid,
                           mask.start, seg, causal=mask.causal)


def splash_attention(q_bshd, k_bskd, v_bskd, valid_bs, segment_ids_bs=None, *,
                     block: int = 512, interpret: bool = False):
  """Causal attention by Pallas splash attention, padding and packing as segment ids.

  Splash attention (`jax.experimental.pallas.ops.tpu.splash_attention`) is FlashAttention
  (Dao et al. 2022, arXiv:2205.14135) for TPU that skips the tiles a block-sparse mask
  (here `CausalMask`) hides; grouped-query heads are native (H a multiple of K).

  Args:
    q_bshd: queries [B,S,H,Dh], already scaled by 1/sqrt(Dh).
    k_bskd, v_bskd: [B,S,K,Dh].
    valid_bs: bool [B,S], True = real token.
    segment_ids_bs: None or int [B,S] (packed rows).
    block: tile size (at most; a multiple of 128). S is padded to a whole number of tiles.
    interpret: run the Pallas kernels in interpret mode (any platform; slow: for tests).
  Returns:
    [B,S,H,Dh] in the value dtype.

  Note: the segment id of token (b, i) is 2·segment + (1 if padding): a real query sees
  only the real tokens of its own segment, and a padding token only padding (splash needs
  every query to see a key; padding rows are never read). Under a mesh set with
  `jax.set_mesh`, the kernel runs per shard (`shard_map`: rows over the batch axes, heads
  over "tensor" when they divide), as a Pallas call is not partitioned by XLA.
  """
  b, s, h, d = q_bshd.shape
  tile = min(block, -(-s // SPLASH_LANES) * SPLASH_LANES)
  pad = -(-s // tile) * tile - s
  seg = jnp.zeros((b, s), jnp.int32) if segment_ids_bs is None else segment_ids_bs
  seg = jnp.pad(2 * seg.astype(jnp.int32) + (~valid_bs.astype(bool)).astype(jnp.int32),
                ((0, 0), (0, pad)), constant_values=1)
  heads = lambda x: jnp.pad(x.swapaxes(1, 2), ((0, 0), (0, 0), (0, pad), (0, 0)))  # noqa: E731
  q, k, v = heads(q_bshd), heads(k_bskd), heads(v_bskd)                          # [B,H|K,S',Dh]
  sizes = dict(block_q=tile, block_kv=tile, block_kv_compute=tile, block_q_dkv=tile,
               block_kv_dkv=tile, block_kv_dkv_compute=tile, block_q_dq=tile, block_kv_dq=tile)
  mesh = jax.sharding.get_abstract_mesh()
  batch_axes, head_axis = _splash_axes(mesh, b, k.shape[1])
  kernel = splash.make_splash_mha(
      splash.MultiHeadMask([splash.CausalMask((s + pad, s + pad))] * h),
      block_sizes=splash.BlockSizes(**sizes), head_shards=mesh.shape.get(head_axis, 1),
      q_seq_shards=1, interpret=interpret)

  def run(kernel, q, k, v, seg):
    return jax.vmap(kernel)(q, k, v, segment_ids=splash.SegmentIds(seg, seg))

  if batch_axes or head_axis:
    spec = PartitionSpec(batch_axes, head_axis, None, None)
    run = jax.shard_map(
        run, mesh=mesh, out_specs=spec, check_vma=False,
        in_specs=(kernel.manual_sharding_spec(NamedSharding(mesh, PartitionSpec(head_axis, None))),
                  spec, spec, spec, PartitionSpec(batch_axes, None)))
  return run(kernel, q, k, v, seg)[:, :, :s].swapaxes(1, 2)


def _splash_axes(mesh, rows: int, kv_heads: int):
  """(batch mesh axes or None, head mesh axis or None) that divide the rows / KV heads;
  axes already manual (inside a `shard_map`, e.g. the sampler's) are left alone."""
  if mesh.empty:
    return None, None
  free = lambda a: mesh.shape.get(a, 1) > 1 and a not in mesh.manual_axes  # noqa: E731
  batch = tuple(a for a in BATCH_AXES if free(a))
  head = "tensor" if free("tensor") and kv_heads % mesh.shape["tensor"] == 0 else None
  rows_split = batch and rows % math.prod(mesh.shape[a] for a in batch) == 0
  return batch if rows_split else None, head


def cudnn_attention(q_bshd, k_bskd, v_bskd, valid_bs, *, implementation: str = "cudnn"):
  """Causal attention by cuDNN's fused kernel (`jax.nn.dot_product_attention`), padded rows
  rolled so that their real tokens come first.

  cuDNN flash attention (FlashAttention-2, Dao 2023, arXiv:2307.08691) masks a row's keys
  and queries by length only (`PADDING_CAUSAL`): each row is rotated left by its first real
  index, attended with its real-token count as both lengths, and rotated back. RoPE was
  applied before, so the rotation changes no score.

  Args:
    q_bshd: queries [B,S,H,Dh], already scaled by 1/sqrt(Dh).
    k_bskd, v_bskd: [B,S,K,Dh].
    valid_bs: bool [B,S], True = real token; each row's real tokens are contiguous (left
      or right padding, as `positions_from_mask` assumes).
    implementation: "cudnn" (GPU, bf16 / f16 only), or "xla" (the same call on any device:
      the tests).
  Returns:
    [B,S,H,Dh] in the value dtype.

  Note: a mask with holes inside a row is not expressible by lengths; packed rows
  (segment ids) go to `chunked` instead (`attend_blocks`).
  """
  s = q_bshd.shape[1]
  valid = valid_bs.astype(bool)
  first = jnp.argmax(valid, axis=1).astype(jnp.int32)                       # [B]
  count = jnp.maximum(jnp.sum(valid, axis=1, dtype=jnp.int32), 1)
  rotate = lambda x, shift: jnp.take_along_axis(  # noqa: E731
      x, ((jnp.arange(s)[None] + shift[:, None]) % s)[:, :, None, None], axis=1)
  out = jax.nn.dot_product_attention(
      rotate(q_bshd, first), rotate(k_bskd, first), rotate(v_bskd, first), scale=1.0,
      is_causal=True, query_seq_lengths=count, key_value_seq_lengths=count,
      implementation=implementation)
  return rotate(out, -first)
