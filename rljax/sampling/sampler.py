"""Batched generation: one jit-compiled program per shape bucket (prefill + while_loop decode).

The model enters the program as `nnx.split(model)`: the graph definition is a static
argument and the parameters a traced one, so new parameters after an RL update reuse the
compiled program. The program's pieces are the shared decode core, `rljax.sampling.decode`.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rljax.parallel import batch_shards, traced_on
from rljax.sampling import buckets
from rljax.sampling.decode import (
  Decoded,
  DecodeSpec,
  decode_segments,
  spec_and_scalars,
  step_sampler,
)
from rljax.sampling.params import SamplingParams
from rljax.sampling.prepare import (
  check_prompts,
  drop_sampling_copies,
  place_rows,
  split_for_sampling,
)
from rljax.sampling.rollout import Rollout
from rljax.sampling.streams import default_streams


def _decode(graphdef, state, tokens_rp, mask_rp, streams_r2, rng, scalars_3, *,
            spec: DecodeSpec, mesh=None) -> Decoded:
  """Prefill + decode loop. Traced once per (bucket, spec, graphdef, mesh), under `mesh`
  (`rljax.parallel.traced_on`: model.attention="auto" picks splash on a TPU slice)."""
  buckets._note_trace()

  def run():
    model = nnx.merge(graphdef, state)
    step = step_sampler(spec, scalars_3, rng, streams_r2)
    return decode_segments(model, tokens_rp, mask_rp, step, spec)[3]
  return traced_on(mesh, run)()


_decode_jit = jax.jit(_decode, static_argnums=(0,), static_argnames=("spec", "mesh"))


def generate(model: nnx.Module, prompt_tokens, prompt_mask, *, sampling: SamplingParams,
             rng: jax.Array, pad_id: int = 0, sampler_dtype: Any = None, mesh=None,
             prompt_bucket: Any = "pow2", batch_bucket: Any = "pow2",
             share_prefill: bool = False, streams=None) -> Rollout:
  """Samples `sampling.n` completions per prompt with a KV cache, as one compiled program.

  Prefills the left-padded prompt batch (each prompt repeated n times), then decodes
  inside `lax.while_loop` until every row has emitted a stop token or T =
  `max_new_tokens` tokens; tokens after a stop token are `pad_id` with mask 0.

  Args:
    model: a decoder with `init_cache(batch, max_len)` and `forward_cached(...)`
      (`rljax.models.Decoder`).
    prompt_tokens: int [B, P], left-padded.
    prompt_mask: int/bool [B, P], 1 on real tokens; every row needs >= 1 real token.
    sampling: `SamplingParams`.
    rng: PRNG key; results are a deterministic function of it (and the inputs).
    pad_id: token written after the stop token (and used for prompt padding).
    sampler_dtype: None (the model's own dtype) or e.g. "bfloat16": sample with a cast
      copy of the parameters and that compute dtype while training stays in float32 (a
      real source of train–inference mismatch).
    mesh: optional `jax.sharding.Mesh`; rows are sharded over its data axes and the
      parameters keep (or get) their logical-axis sharding; the program is traced under it
      (`rljax.parallel.traced_on`).
    prompt_bucket, batch_bucket: rounding of P and of B*n ("pow2", an int multiple, or
      None for exact shapes); one program is compiled per bucket.
    share_prefill: prefill each prompt once for its n samples (same cache, n-fold less
      prefill compute).
    streams: int [B*n, 2], the random stream of each completion (`streams.stream_uniforms`);
      default (prompt index, sample index), so sample j of prompt b draws the same numbers
      whatever n, the batch or its padding.
  Returns:
    `Rollout` with B*n rows (padding rows dropped), T = max_new_tokens columns.
  """
  if not isinstance(sampling, SamplingParams):
    raise TypeError(f"sampling must be a SamplingParams, got {type(sampling).__name__}")
  tokens_bp, mask_bp = check_prompts(prompt_tokens, prompt_mask, model)
  n = sampling.n
  tokens_bp, mask_bp = np.repeat(tokens_bp, n, axis=0), np.repeat(mask_bp, n, axis=0)
  rows, width = tokens_bp.shape
  group = n if share_prefill else 1
  r = buckets.round_up(rows, batch_bucket, multiple_of=batch_shards(mesh) * group)
  w = buckets.round_up(width, prompt_bucket)
  tokens_rw, mask_rw = buckets.pad_prompts(tokens_bp, mask_bp, rows=r, width=w, pad_id=pad_id)
  streams_r2 = default_streams(r, n) if streams is None else jnp.concatenate(
      [jnp.asarray(streams, jnp.int32), default_streams(r, n)[rows:]])
  tokens_rw, mask_rw, model = place_rows(mesh, tokens_rw, mask_rw, model)
  if mesh is not None:
    streams_r2 = jax.device_put(streams_r2, tokens_rw.sharding)
  out = generate_rows(model, tokens_rw, mask_rw, sampling=sampling, rng=rng, pad_id=pad_id,
                      sampler_dtype=sampler_dtype, share_prefill=share_prefill,
                      streams=streams_r2, mesh=mesh)
  if r != rows:   # drop the bucket's padding rows (a dispatch per field, so only if any)
    out = jax.tree.map(lambda x: x[:rows], out)
  return Rollout(
      tokens=out.tokens, mask=out.mask, logp=out.logp, logp_full=out.logp_full,
      truncated=out.truncated,
      group_id=jnp.asarray(np.repeat(np.arange(rows // n, dtype=np.int32), n)),
      prompt_tokens=jnp.asarray(tokens_bp), prompt_mask=jnp.asarray(mask_bp),
      routes=None if out.routes is None else out.routes[:, w - width:])


def generate_rows(model: nnx.Module, tokens_rw: jax.Array, mask_rw: jax.Array, *,
                  sampling: SamplingParams, rng: jax.Array, pad_id: int = 0,
                  sampler_dtype: Any = None, share_prefill: bool = False, streams=None,
                  mesh=None):
  """`generate` for prompt rows the caller has already repeated, padded and placed.

  For global arrays that span processes (multi-host: each process built only its own
  rows, `jax.make_array_from_callback`), which `generate`'s host-side checks, repeat and
  padding cannot read. Row r is one completion; `sampling.n` is not applied again. Same
  program and random draws as `generate` on the same R x W rows.

  Args:
    model, sampling, rng, pad_id, sampler_dtype: as in `generate`.
    tokens_rw: int32 [R, W] left-padded prompt rows (padding rows: one real token).
    mask_rw: int32 [R, W], 1 on real tokens.
    share_prefill: rows come in groups of `sampling.n` copies of one prompt (R a multiple
      of n): prefill each group once.
    streams: int32 [R, 2], each row's random stream, placed like the rows (default
      (r // n, r % n), as `generate`).
    mesh: the mesh the rows and parameters live on (None: one device); the program is
      traced under it, as `generate`'s.
  Returns:
    `Decoded` (tokens, mask, logp, logp_full, truncated; routes [R, W + T, L_moe, k] of a
    MoE policy) of all R rows, as in `Rollout`.
  """
  graphdef, state, made = split_for_sampling(model, sampler_dtype, layer_views=True)
  spec, scalars_3 = spec_and_scalars(sampling, pad_id, sampling.n if share_prefill else 1)
  if streams is None:
    streams = default_streams(tokens_rw.shape[0], sampling.n)
  out = buckets.call_releasing(_decode_jit, graphdef, state, tokens_rw, mask_rw, streams, rng,
                               scalars_3, spec=spec, mesh=mesh)
  drop_sampling_copies(made, out)
  return out


