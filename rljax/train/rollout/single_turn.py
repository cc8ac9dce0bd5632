"""Single-turn rollouts: prompts -> completions (static or continuous batching) -> scores.

Host-side glue between the sampler (jit), the tokenizer and the reward functions
(Python). The batch has fixed shapes: B = prompts · n rows, P prompt columns, T =
max_new_tokens columns. Its sequence arrays are global `jax.Array`s split over the mesh's
batch axes; under `jax.distributed` each process tokenizes, decodes and scores only the rows
on its own devices, and every process then holds the per-row scores of all B rows as NumPy
arrays (advantages, metrics and the prompt sampler need them).
"""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from rljax import parallel
from rljax.sampling import buckets, generate_rows
from rljax.sampling.continuous import continuous_rows, decode_slots
from rljax.train.rollout.batch import RolloutBatch
from rljax.train.rollout.context import (
  RolloutContext,
  batch_shards,
  encode_prompts,
  row_layout,
  row_streams,
  score_texts,
)
from rljax.train.rollout.partial import SegmentedPolicy, sample_segments


@dataclasses.dataclass(frozen=True)
class SingleTurn:
  """One completion per row, sampled by the static or the continuous sampler.

  Attributes:
    continuous: continuous batching (`rljax.sampling.continuous`) over `slots` decode
      slots (0: every row resident, drained onto fewer slots as rows finish); the static
      sampler decodes the rows in waves of `slots` rows (0: all at once; `static_waves`).
    share_prefill: one prefill per prompt for its n samples (both samplers).
  """

  ctx: RolloutContext
  continuous: bool = True
  slots: int = 0
  share_prefill: bool = True

  def with_context(self, ctx: RolloutContext) -> SingleTurn:
    return dataclasses.replace(self, ctx=ctx)

  def sample(self, model, prompts, rng, *, sampling=None) -> dict:
    """Generates `sampling.n` completions per prompt, each process tokenizing only its rows.

    `model` is a model, or a `SegmentedPolicy` whose versions take turns (partial rollouts,
    `rljax.train.rollout.partial`).

    Row i (completion i % n of prompt i // n) lives on one device of the mesh; the process
    owning that device encodes its prompt. The sampler runs on the global rows, so every
    row draws the same random numbers as in a single process.

    Returns:
      dict of global `jax.Array`s with R rows split over the batch axes (`row_layout`; rows
      >= len(prompts)·n are padding): prompt_tokens, prompt_mask [R, P]; tokens, mask,
      sampler_logp [R, T]; truncated [R]; a MoE policy's routes [R, P + T, L_moe, k]
      (`rljax.sampling.Rollout.routes`).
    """
    ctx = self.ctx
    sampling = sampling or ctx.sampling
    n, b, p = sampling.n, len(prompts) * sampling.n, ctx.prompt_len
    sharding, r = row_layout(ctx, b)
    local = parallel.local_rows(sharding, r)
    real = local[local < b]
    tokens, mask = (encode_prompts(ctx, [prompts[i // n] for i in real]) if len(real)
                    else (np.zeros((0, p), np.int32),) * 2)
    put = lambda x: parallel.from_local_rows(x, local, sharding, r)  # noqa: E731
    pad = lambda width, pad_id: buckets.pad_prompts(  # noqa: E731
        tokens, mask, rows=len(local), width=width, pad_id=pad_id)
    # The sampler's own prompt bucket and pad id, as `generate` uses them.
    rows_in = map(put, pad(buckets.round_up(p, "pow2"), 0))
    # each row draws from (its prompt, its sample index): common random numbers across runs
    streams = put(row_streams(prompts, n, r)[local])
    generate = self._generator(r, b, streams)
    routes = None   # partial rollouts record none (versions change mid-request)
    if isinstance(model, SegmentedPolicy):   # partial rollouts: versions change mid-request
      tokens_rt, mask_rt, logp_rt, truncated = sample_segments(
          generate, model, *rows_in, sampling=sampling, rng=rng)
    else:
      out = generate(model, *rows_in, sampling, rng, True)
      tokens_rt, mask_rt, logp_rt, truncated = out.tokens, out.mask, out.logp, out.truncated
      if out.routes is not None:   # the sampler's prompt bucket -> the batch's P columns
        routes = out.routes[:, out.routes.shape[1] - tokens_rt.shape[1] - p:]
    prompt_tokens, prompt_mask = map(put, pad(p, ctx.tokenizer.pad_id))
    rows = {"prompt_tokens": prompt_tokens, "prompt_mask": prompt_mask, "tokens": tokens_rt,
            "mask": mask_rt, "sampler_logp": logp_rt, "truncated": truncated}
    if routes is not None:
      rows["routes"] = routes
    return jax.device_put(rows, sharding)

  def _generator(self, rows: int, real_rows: int, streams):
    """`generate(model, tokens, mask, sampling, rng, grouped) -> Decoded` on `rows` placed
    prompt rows (the first `real_rows` real), by the continuous or the static sampler;
    `grouped`: each group of n rows holds one prompt (its prefill can be shared)."""
    ctx = self.ctx

    def generate(model, tokens, mask, sampling, rng, grouped):
      share = grouped and self.share_prefill
      dtype = ctx.sampler_dtype or None
      if self.continuous:
        return continuous_rows(
            model, tokens, mask, sampling=sampling, rng=rng, num_rows=real_rows,
            slots=decode_slots(self.slots, rows, batch_shards(ctx.mesh)),
            share_prefill=share, mesh=ctx.mesh, streams=streams, sampler_dtype=dtype)
      shards = batch_shards(ctx.mesh)
      waves = static_waves(self.slots, rows, shards)
      # whole groups in every wave of every shard (padding repeats a shard's last prompt)
      share = share and not (rows // shards) % sampling.n and not (
          wave_rows(waves, rows, shards) // shards % sampling.n)
      return in_waves(
          lambda t, m, st: generate_rows(model, t, m, sampling=sampling, rng=rng,
                                         share_prefill=share, streams=st, mesh=ctx.mesh,
                                         sampler_dtype=dtype),
          waves, batch_shards(ctx.mesh), tokens, mask, streams)
    return generate

  def score(self, prompts, rows, n) -> RolloutBatch:
    """Decodes and scores this process's completions of `rows` (from `sample`); then every
    process holds all B rows' scores, components and lengths. The sequence arrays stay
    global."""
    ctx = self.ctx
    b = len(prompts) * n
    sharding, r = row_layout(ctx, b)
    local = parallel.local_rows(sharding, r)
    real = local[local < b]
    tokens, mask, prompt_mask = (parallel.to_local_rows(rows[k], real)
                                 for k in ("tokens", "mask", "prompt_mask"))
    texts = [ctx.tokenizer.decode(tokens[k][mask[k] > 0].tolist()) for k in range(len(real))]
    total, components, failed = score_texts(ctx, [prompts[i // n] for i in real], texts)
    per_row = {"scores": total, "reward_failed": failed,
               "lengths": mask.sum(axis=1).astype(np.int32),
               "prompt_lengths": prompt_mask.sum(axis=1).astype(np.int32),
               **{f"reward/{k}": v for k, v in components.items()}}
    pad = len(local) - len(real)   # padding rows come last in `local`
    per_row = {k: parallel.from_local_rows(np.pad(np.asarray(v), (0, pad)), local, sharding, r)
               for k, v in per_row.items()}
    host = {k: v[:b] for k, v in parallel.gather(per_row).items()}
    return RolloutBatch(
        prompts=list(prompts), **{k: rows[k] for k in (
            "prompt_tokens", "prompt_mask", "tokens", "mask", "sampler_logp", "truncated")},
        scores=host.pop("scores"), reward_failed=host.pop("reward_failed"),
        lengths=host["lengths"], prompt_lengths=host.pop("prompt_lengths"),
        extent=host.pop("lengths"), accuracy=host["reward/accuracy"],
        format=host["reward/format"], group_id=np.repeat(np.arange(len(prompts), dtype=np.int32), n),
        components={k.removeprefix("reward/"): v for k, v in host.items()},
        routes=rows.get("routes"))

  def sample_and_score(self, model, prompts, rng, *, sampling=None) -> RolloutBatch:
    """`score(sample(...))`: B = len(prompts) · sampling.n scored rows."""
    sampling = sampling or self.ctx.sampling
    t0 = time.perf_counter()
    rows = jax.block_until_ready(self.sample(model, prompts, rng, sampling=sampling))
    t1 = time.perf_counter()
    batch = self.score(prompts, rows, sampling.n)
    batch.seconds = {"generate_s": t1 - t0, "score_s": time.perf_counter() - t1}
    return batch


def static_waves(slots: int, rows: int, shards: int) -> int:
  """Waves the static sampler decodes `rows` rows in with `sampling.slots` = `slots` (0: one
  wave): each wave holds at most `slots` rows (rounded down to a multiple of the batch
  shards, at least one row per shard), an equal share of every shard's rows, so that only
  one wave's KV cache is resident. Waves that do not split a shard's rows evenly are padded
  (`in_waves`). A wave that splits a prompt's n samples prefills each row itself."""
  if not slots or slots >= rows:
    return 1
  return -(-(rows // shards) // max(1, slots // shards))


def wave_rows(waves: int, rows: int, shards: int) -> int:
  """Rows of one of `waves` waves over `rows` rows (all shards; padding included)."""
  return -(-(rows // shards) // waves) * shards


def in_waves(fn, waves: int, shards: int, *rows):
  """`fn(*rows)` run over `waves` waves of the rows, results put back in row order: wave w
  takes the w-th contiguous block of every batch shard's rows (each shard decodes its own
  rows; a row's tokens depend only on its own random stream, not on its wave). When the
  waves do not split a shard's rows evenly, its last row is repeated to fill the last wave
  and those copies' results are dropped."""
  if waves == 1:
    return fn(*rows)
  per_shard = rows[0].shape[0] // shards
  size = wave_rows(waves, rows[0].shape[0], shards) // shards
  extra = waves * size - per_shard

  def padded(x):   # [shards, waves * size, ...]
    x = x.reshape((shards, per_shard) + x.shape[1:])
    return jnp.concatenate([x, jnp.repeat(x[:, -1:], extra, axis=1)], axis=1) if extra else x

  def wave(x, w):
    return x[:, w * size:(w + 1) * size].reshape((-1,) + x.shape[2:])

  def merge(*xs):
    blocks = jnp.concatenate([x.reshape((shards, size) + x.shape[1:]) for x in xs], axis=1)
    return blocks[:, :per_shard].reshape((-1,) + xs[0].shape[1:])
  rows = [padded(x) for x in rows]
  return jax.tree.map(merge, *[fn(*[wave(x, w) for x in rows]) for w in range(waves)])

