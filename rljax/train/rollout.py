"""Rollout and scoring: prompts -> completions -> scores, with the DAPO filters.

Host-side glue between the sampler (jit), the tokenizer and the reward functions
(Python). The batch has fixed shapes: B = prompts_per_iteration · n rows, P prompt
columns, T = max_new_tokens columns. Its sequence arrays are global `jax.Array`s split
over the mesh's batch axes; under `jax.distributed` each process tokenizes, decodes and
scores only the rows on its own devices, and every process then holds the per-row scores
of all B rows as NumPy arrays (advantages, metrics and the prompt sampler need them).
"""

from __future__ import annotations

import dataclasses
import math
import time

import jax
import numpy as np

from rljax import parallel
from rljax.data.batching import left_pad
from rljax.data.buffer import DynamicSamplingBuffer, DynamicSamplingError
from rljax.parallel import BATCH_AXES, batch_sharding
from rljax.sampling import SamplingParams, buckets, generate_rows
from rljax.sampling.continuous import continuous_rows

REWARD_PREFIX = "reward/"   # row keys of the unweighted reward components


def prompt_ids(tokenizer, text, *, chat_template=False):
  """Token ids of one prompt: `[bos] + text` (no bos when the tokenizer has none, e.g.
  Qwen), or the text as one user turn of the tokenizer's chat template (which brings its
  own special tokens) followed by the assistant header."""
  if chat_template:
    return tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": text}]))
  return ([] if tokenizer.bos_id is None else [tokenizer.bos_id]) + tokenizer.encode(text)


@dataclasses.dataclass
class RolloutContext:
  """What a rollout needs besides the policy (built once per run)."""

  task: object
  tokenizer: object
  prompt_len: int
  sampling: SamplingParams
  reward_fn: object          # rljax.rewards.base.Composite: (prompts, texts) -> ComposedRewards
  chat_template: bool = False
  mesh: object = None        # rows are split over its batch axes (None: one device)
  continuous: bool = False   # continuous batching (rljax.sampling.continuous) ...
  slots: int = 0             # ... over this many decode slots (0: all rows)
  share_prefill: bool = True  # one prefill per prompt for its n samples
  episodes: object = None    # rljax.train.multiturn.EpisodeConfig with task.env, else None

  def prompt_ids(self, prompt):
    """Ids of a prompt, left-truncated to the prompt columns (task.long_prompts="truncate")."""
    return prompt_ids(self.tokenizer, prompt.text,
                      chat_template=self.chat_template)[-self.prompt_len:]


def encode_prompts(ctx: RolloutContext, prompts):
  ids = [ctx.prompt_ids(p) for p in prompts]
  return left_pad(ids, pad_id=ctx.tokenizer.pad_id, length=ctx.prompt_len)


def row_layout(ctx: RolloutContext, num_rows: int):
  """(sharding, R): rows split over the mesh's batch axes, R = num_rows rounded up to a
  multiple of the batch shards (R = B for a training batch, which validate() checks)."""
  if ctx.mesh is None:
    return jax.sharding.SingleDeviceSharding(jax.devices()[0]), num_rows
  shards = math.prod(ctx.mesh.shape[a] for a in BATCH_AXES)
  return batch_sharding(ctx.mesh), buckets.round_up(num_rows, None, multiple_of=shards)


def sample(ctx: RolloutContext, model, prompts, rng, *, sampling=None):
  """Generates `sampling.n` completions per prompt, each process tokenizing only its rows.

  Row i (completion i % n of prompt i // n) lives on one device of the mesh; the process
  owning that device encodes its prompt. The sampler runs on the global rows, so every
  row draws the same random numbers as in a single process.

  Returns:
    dict of global `jax.Array`s with R rows split over the batch axes (`row_layout`;
    rows >= len(prompts)·n are padding): prompt_tokens, prompt_mask [R, P]; tokens, mask,
    sampler_logp [R, T]; truncated [R].
  """
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
  if ctx.continuous:
    shards = 1 if ctx.mesh is None else math.prod(ctx.mesh.shape[a] for a in BATCH_AXES)
    out = continuous_rows(model, *rows_in, sampling=sampling, rng=rng,
                          slots=decode_slots(ctx.slots, r, shards), num_rows=b,
                          share_prefill=ctx.share_prefill, mesh=ctx.mesh)
  else:
    out = generate_rows(model, *rows_in, sampling=sampling, rng=rng,
                        share_prefill=ctx.share_prefill)
  prompt_tokens, prompt_mask = map(put, pad(p, ctx.tokenizer.pad_id))
  return jax.device_put({
      "prompt_tokens": prompt_tokens, "prompt_mask": prompt_mask, "tokens": out.tokens,
      "mask": out.mask, "sampler_logp": out.logp, "truncated": out.truncated}, sharding)


def decode_slots(slots: int, rows: int, shards: int) -> int:
  """Slots of one continuous-batching call: `slots` (0: all rows, resident from the start
  and drained onto fewer slots as they finish), at most the rows, a multiple of the shards."""
  want = slots or rows
  return max(shards, min(rows, want) // shards * shards)


def score(ctx: RolloutContext, prompts, rows, n):
  """Decodes and scores this process's completions; then every process holds all B rows'
  scores, accuracy, format, reward_failed, lengths, prompt_lengths, truncated and group_id
  (NumPy [B]).
  The sequence arrays stay global (`sample`)."""
  b = len(prompts) * n
  sharding, r = row_layout(ctx, b)
  local = parallel.local_rows(sharding, r)
  real = local[local < b]
  tokens, mask, prompt_mask = (parallel.to_local_rows(rows[k], real)
                               for k in ("tokens", "mask", "prompt_mask"))
  texts = [ctx.tokenizer.decode(tokens[k][mask[k] > 0].tolist()) for k in range(len(real))]
  rewards = ctx.reward_fn([prompts[i // n] for i in real], texts)
  failed = np.zeros(len(real), np.int32)
  for failure in rewards.failures:
    failed[failure.index] = 1
    print(f"[rljax] reward {failure.component!r} failed on prompt {failure.prompt_id}: "
          f"{failure.kind}: {failure.message}")
  per_row = dict(scores=rewards.total, accuracy=rewards.components["accuracy"],
                 format=rewards.components["format"], reward_failed=failed,
                 lengths=mask.sum(axis=1).astype(np.int32),
                 prompt_lengths=prompt_mask.sum(axis=1).astype(np.int32))
  # every component, unweighted ("reward/<name>"): logged, and GDPO normalises each one
  per_row.update({f"{REWARD_PREFIX}{name}": v for name, v in rewards.components.items()})
  pad = len(local) - len(real)   # padding rows come last in `local`
  per_row = {k: parallel.from_local_rows(np.pad(np.asarray(v), (0, pad)), local, sharding, r)
             for k, v in per_row.items()}
  per_row["truncated"] = rows["truncated"]
  rows.update({k: v[:b] for k, v in parallel.gather(per_row).items()})
  rows["group_id"] = np.repeat(np.arange(len(prompts), dtype=np.int32), n)
  return rows


def sample_and_score(ctx: RolloutContext, model, prompts, rng, *, sampling=None):
  """`score(sample(...))`, or with `task.env` multi-turn episodes scored the same way
  (`rljax.train.multiturn`): same row layout, plus the episodes' statuses and metrics."""
  sampling = sampling or ctx.sampling
  if ctx.episodes is None:
    return score(ctx, prompts, sample(ctx, model, prompts, rng, sampling=sampling), sampling.n)
  from rljax.train import multiturn
  return multiturn.sample_and_score(ctx, model, prompts, rng, sampling=sampling)


def _zero_variance_fraction(scores, n):
  return float(np.mean(scores.reshape(-1, n).std(axis=1) == 0)) if n > 1 else 0.0


def collect(ctx, model, draw_prompts, rng_fn, *, num_prompts, dynamic_sampling, max_rounds):
  """Samples and scores `num_prompts` groups of `n` completions.

  With dynamic sampling (DAPO, arXiv:2503.14476, Sec. 3.2, Eq. 11) groups whose
  accuracies are all equal are dropped (the verl recipe filters on accuracy) and more
  prompts are drawn until `num_prompts` informative groups are filled;
  `rljax.data.buffer.DynamicSamplingBuffer` raises a clear error after `max_rounds`.

  Returns:
    (rows dict with B = num_prompts·n rows in group-major order, prompts list, stats dict)
  """
  n = ctx.sampling.n
  gen_s = score_s = 0.0
  buffer = DynamicSamplingBuffer(num_prompts, max_rounds=max_rounds)
  zero_var = None
  while True:
    prompts = draw_prompts(num_prompts)
    t0 = time.perf_counter()
    if ctx.episodes is not None:   # sampling and scoring interleave with the environments
      rows = sample_and_score(ctx, model, prompts, rng_fn())
      t1 = time.perf_counter()
    else:
      rows = jax.block_until_ready(sample(ctx, model, prompts, rng_fn()))
      t1 = time.perf_counter()
      rows = score(ctx, prompts, rows, n)
    gen_s, score_s = gen_s + t1 - t0, score_s + time.perf_counter() - t1
    if zero_var is None:
      zero_var = _zero_variance_fraction(rows["accuracy"], n)
    if not dynamic_sampling:
      break
    rows = parallel.gather(rows)   # the buffer picks groups on the host: all rows everywhere
    rows["prompt"] = [prompts[i // n] for i in range(len(prompts) * n)]
    rows["total_scores"] = rows.pop("scores")   # the buffer keeps its filter metric as "scores"
    try:
      buffer.add(rows["accuracy"], rows.pop("group_id"), **rows)
    except DynamicSamplingError as err:
      raise DynamicSamplingError(f"{err} (config field: algo.dynamic_sampling_max_rounds)") from err
    if buffer.ready:
      rows = buffer.take()
      rows["scores"] = rows.pop("total_scores")
      prompts = rows.pop("prompt")[::n]
      break
  stats = {"train/generation_rounds": buffer.last_stats.get("rounds", 1),
           "train/zero_variance_group_frac": zero_var,
           "time/generate_s": gen_s, "time/score_s": score_s}
  return rows, prompts, stats
