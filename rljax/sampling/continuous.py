"""Continuous batching: a fixed number of decode slots, refilled as rows finish.

A static batch decodes every row until the longest one stops; with long-tailed lengths
most row-steps are spent on finished rows. Here R requests (B prompts × n samples) share
S < R slots: one compiled `lax.while_loop` either inserts the next waiting request into
a free slot (copying its prompt's KV in, prefilled once per prompt and kept for its n
samples) or advances every slot by one token. No host round trip, one program per shape
bucket. The design follows JetStream's (AI-Hypercomputer/JetStream) `prefill` / `insert` /
`generate` slot API and tpu-inference's (vllm-project/tpu-inference) "decode until a slot
frees, then refill" loop, written as one on-device loop.

A request's tokens depend only on its own stream: its step t reads the uniform of
`streams.stream_uniforms` for its stream, exactly as the same row of the static sampler
(`rljax.sampling.sampler`) does, so the same request gives the same tokens and log-probs
whichever slot it ran in, and in either sampler (up to float summation order).
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import PartitionSpec as P

from rljax.parallel import BATCH_AXES, batch_sharding, batch_shards
from rljax.sampling import buckets
from rljax.sampling.decode import (
  Decoded,
  is_routed,
  spec_and_scalars,
)
from rljax.sampling.params import SamplingParams
from rljax.sampling.prepare import (
  check_prompts,
  drop_sampling_copies,
  place_rows,
  split_for_sampling,
)
from rljax.sampling.rollout import Rollout
from rljax.sampling.slot_loop import slot_loop
from rljax.sampling.streams import default_streams


def _continuous(graphdef, state, tokens_rw, mask_rw, prompt_id_r, streams_r2, num_rows, rng,
                scalars_3, *, spec, slots: int, share_prefill: bool, mesh=None) -> Decoded:
  """The slot loop as one program; with a mesh, one independent loop per batch shard
  (`shard_map`: each shard decodes its own rows through slots / shards slots)."""
  buckets._note_trace()
  total = tokens_rw.shape[0]
  request_id = jnp.arange(total, dtype=jnp.int32)
  kwargs = dict(spec=spec, share_prefill=share_prefill)
  if mesh is None:
    return slot_loop(nnx.merge(graphdef, state), tokens_rw, mask_rw, prompt_id_r, streams_r2,
                     num_rows, rng, scalars_3, slots=slots, **kwargs)
  axes = tuple(a for a in BATCH_AXES if a in mesh.axis_names)
  shards = batch_shards(mesh)
  rows = P(axes)
  per_shard = total // shards

  def local(state, tokens, mask, prompt_id, streams, request_id, num_rows, rng, scalars_3):
    first = request_id[0]
    real = jnp.clip(num_rows - first, 0, per_shard)
    return slot_loop(nnx.merge(graphdef, state), tokens, mask, prompt_id, streams, real,
                     rng, scalars_3, slots=slots // shards, **kwargs)
  state_spec = jax.tree.map(lambda _: P(), state)
  out_spec = Decoded(*([rows] * 5), routes=rows if is_routed(nnx.merge(graphdef, state)) else None)
  return jax.shard_map(local, mesh=mesh,
                       in_specs=(state_spec, rows, rows, rows, rows, rows, P(), P(), P()),
                       out_specs=out_spec, check_vma=False)(
      state, tokens_rw, mask_rw, prompt_id_r, streams_r2, request_id, num_rows, rng, scalars_3)


_continuous_jit = jax.jit(_continuous, static_argnums=(0,),
                          static_argnames=("spec", "slots", "share_prefill", "mesh"))


def continuous_rows(model, tokens_rw, mask_rw, *, sampling: SamplingParams, rng, slots: int,
                    num_rows=None, share_prefill: bool = True, pad_id: int = 0,
                    sampler_dtype=None, mesh=None, streams=None) -> Decoded:
  """The continuous-batching counterpart of `rljax.sampling.generate_rows`: prompt rows
  already repeated (each prompt's `sampling.n` samples consecutive), padded and placed.

  Args:
    tokens_rw, mask_rw: int [R, W], left-padded; R a multiple of the mesh's batch shards.
    slots: S decode slots in all (S / shards per shard with a mesh).
    num_rows: the first `num_rows` rows are real (default R).
    share_prefill: rows r with the same r // n share one prefill.
    mesh: rows sharded over its batch axes; each shard runs its own slot loop.
    streams: int32 [R, 2], each row's random stream, placed like the rows (default
      (r // n, r % n), as `generate_rows`).
  Returns:
    `Decoded` (tokens, mask, logp, logp_full [R, T]; truncated [R]), as `generate_rows`.
  """
  graphdef, state, made = split_for_sampling(model, sampler_dtype, layer_views=True)
  spec, scalars_3 = spec_and_scalars(sampling, pad_id, sampling.n if share_prefill else 1)
  total = tokens_rw.shape[0]
  prompt_id = jnp.arange(total, dtype=jnp.int32) // sampling.n
  if streams is None:
    streams = default_streams(total, sampling.n)
  if mesh is not None:
    prompt_id = jax.device_put(prompt_id, batch_sharding(mesh))
    streams = jax.device_put(streams, batch_sharding(mesh))
  num = total if num_rows is None else num_rows
  out = buckets.call_releasing(
      _continuous_jit, graphdef, state, tokens_rw, mask_rw, prompt_id, streams,
      jnp.asarray(num, jnp.int32), rng, scalars_3, spec=spec, slots=int(slots),
      share_prefill=share_prefill, mesh=mesh)
  drop_sampling_copies(made, out)
  return out


def decode_slots(slots: int, rows: int, shards: int) -> int:
  """Slots of one continuous-batching call: `slots` (0: all rows, resident from the start
  and drained onto fewer slots as they finish), at most the rows, a multiple of the shards."""
  want = slots or rows
  return max(shards, min(rows, want) // shards * shards)


def generate_continuous(model: nnx.Module, prompt_tokens, prompt_mask, *,
                        sampling: SamplingParams, rng: jax.Array, slots: int,
                        share_prefill: bool = True, pad_id: int = 0, sampler_dtype=None,
                        prompt_bucket="pow2", batch_bucket="pow2", mesh=None) -> Rollout:
  """`rljax.sampling.generate` with continuous batching over `slots` decode slots.

  Same arguments, same `Rollout` (B·n rows, prompt-major) and, request by request, the
  same tokens and log-probs as `generate` with the same `rng` (float summation order
  aside). Prompts are bucketed like `generate`'s; `slots` is the decode batch: the speed-up
  over the static sampler grows with max/mean completion length when slots < B·n.

  Args:
    slots: S ≥ 1 decode slots (rounded to the request count when larger).
    share_prefill: prefill each distinct prompt once and copy its KV into its n samples'
      slots as they start (n-fold less prefill).
    mesh: optional `jax.sharding.Mesh`, as in `generate`: each batch shard holds whole
      prompts (with their n samples) and runs its own slot loop over `slots / shards` slots.
  """
  if not isinstance(sampling, SamplingParams):
    raise TypeError(f"sampling must be a SamplingParams, got {type(sampling).__name__}")
  if int(slots) < 1:
    raise ValueError(f"slots={slots} must be >= 1")
  tokens_bp, mask_bp = check_prompts(prompt_tokens, prompt_mask, model)
  b, width = tokens_bp.shape
  shards = batch_shards(mesh)
  rows = buckets.round_up(b, batch_bucket, multiple_of=shards)
  w = buckets.round_up(width, prompt_bucket)
  tokens_bw, mask_bw = buckets.pad_prompts(tokens_bp, mask_bp, rows=rows, width=w,
                                           pad_id=pad_id)
  n = sampling.n
  slots = decode_slots(int(slots), b * n, shards)
  tokens_rw, mask_rw = np.repeat(tokens_bw, n, 0), np.repeat(mask_bw, n, 0)
  tokens_rw, mask_rw, model = place_rows(mesh, tokens_rw, mask_rw, model)
  out = continuous_rows(model, tokens_rw, mask_rw,
                        sampling=sampling, rng=rng, slots=slots, num_rows=b * n,
                        share_prefill=share_prefill, pad_id=pad_id,
                        sampler_dtype=sampler_dtype, mesh=mesh)
  if rows != b:
    out = jax.tree.map(lambda x: x[:b * n], out)
  chex.assert_shape(out.tokens, (b * n, sampling.max_new_tokens))
  return Rollout(
      tokens=out.tokens, mask=out.mask, logp=out.logp, logp_full=out.logp_full,
      truncated=out.truncated,
      group_id=jnp.asarray(np.repeat(np.arange(b, dtype=np.int32), n)),
      prompt_tokens=jnp.asarray(np.repeat(tokens_bp, n, axis=0)),
      prompt_mask=jnp.asarray(np.repeat(mask_bp, n, axis=0)),
      routes=None if out.routes is None else out.routes[:, w - width:])
