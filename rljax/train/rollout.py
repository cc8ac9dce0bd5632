"""Rollout and scoring: prompts -> completions -> scores, with the DAPO filters.

Host-side glue between the sampler (jit), the tokenizer and the reward functions
(Python). The returned batch is a dict of NumPy arrays with fixed shapes:
B = prompts_per_iteration · n rows, P prompt columns, T = max_new_tokens columns.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from rljax.data.batching import left_pad
from rljax.sampling import SamplingParams, generate


@dataclasses.dataclass
class RolloutContext:
  """What a rollout needs besides the policy (built once per run)."""

  task: object
  tokenizer: object
  prompt_len: int
  sampling: SamplingParams
  reward_fn: object          # rljax.rewards.base.Composite: (prompts, texts) -> ComposedRewards


def encode_prompts(ctx: RolloutContext, prompts):
  ids = [[ctx.tokenizer.bos_id] + ctx.tokenizer.encode(p.text) for p in prompts]
  return left_pad(ids, pad_id=ctx.tokenizer.pad_id, length=ctx.prompt_len)


def _pad_time(x, length, value=0):
  if x.shape[1] == length:
    return x
  pad = np.full((x.shape[0], length - x.shape[1]), value, dtype=x.dtype)
  return np.concatenate([x, pad], axis=1)


def sample(ctx: RolloutContext, model, prompts, rng, *, sampling=None):
  """Generates `sampling.n` completions per prompt; returns a dict of NumPy arrays."""
  sampling = sampling or ctx.sampling
  tokens, mask = encode_prompts(ctx, prompts)
  out = generate(model, tokens, mask, sampling=sampling, rng=rng)
  t = sampling.max_new_tokens
  rows = {
      "prompt_tokens": np.asarray(out.prompt_tokens), "prompt_mask": np.asarray(out.prompt_mask),
      "tokens": _pad_time(np.asarray(out.tokens), t, ctx.tokenizer.pad_id),
      "mask": _pad_time(np.asarray(out.mask), t),
      "sampler_logp": _pad_time(np.asarray(out.logp, np.float32), t),
      "truncated": np.asarray(out.truncated, bool),
      "group_id": np.asarray(out.group_id),
  }
  return rows


def score(ctx: RolloutContext, prompts, rows, n):
  """Decodes completions and scores them: adds scores, accuracy, format, lengths, texts."""
  b = rows["tokens"].shape[0]
  texts = [ctx.tokenizer.decode(rows["tokens"][i][rows["mask"][i] > 0].tolist()) for i in range(b)]
  rewards = ctx.reward_fn([prompts[i // n] for i in range(b)], texts)
  failed = np.zeros(b, np.int32)
  for failure in rewards.failures:
    failed[failure.index] = 1
    print(f"[rljax] reward {failure.component!r} failed on prompt {failure.prompt_id}: "
          f"{failure.kind}: {failure.message}")
  rows.update(scores=rewards.total, accuracy=rewards.components["accuracy"],
              format=rewards.components["format"], reward_failed=failed,
              lengths=rows["mask"].sum(axis=1).astype(np.int32))
  rows["texts"] = texts
  return rows


def concat_rows(parts):
  out = {}
  for key in parts[0]:
    if key == "texts":
      out[key] = [t for p in parts for t in p[key]]
    else:
      out[key] = np.concatenate([p[key] for p in parts], axis=0)
  return out


def take_rows(rows, index):
  return {k: ([v[i] for i in index] if k == "texts" else v[index]) for k, v in rows.items()}


def collect(ctx, model, draw_prompts, rng_fn, *, num_prompts, dynamic_sampling, max_rounds):
  """Samples and scores `num_prompts` groups.

  With dynamic sampling (DAPO, arXiv:2503.14476 Sec. 3.2), groups whose scores are all
  equal are dropped and more prompts are drawn until `num_prompts` informative groups
  are filled; after `max_rounds` generation rounds a RuntimeError says so.

  Returns:
    (rows dict with B = num_prompts·n rows in group-major order, prompts list, stats dict)
  """
  n = ctx.sampling.n
  kept_rows, kept_prompts, rounds, drawn, zero_var = [], [], 0, 0, 0
  t0 = time.perf_counter()
  gen_s = 0.0
  while len(kept_prompts) < num_prompts:
    if rounds >= max_rounds:
      raise RuntimeError(
          f"dynamic sampling filled {len(kept_prompts)}/{num_prompts} groups with non-zero "
          f"score variance after {rounds} rounds (algo.dynamic_sampling_max_rounds={max_rounds}); "
          "raise the limit, use easier prompts, or turn algo.dynamic_sampling off")
    prompts = draw_prompts(num_prompts)
    t_gen = time.perf_counter()
    rows = sample(ctx, model, prompts, rng_fn())
    gen_s += time.perf_counter() - t_gen
    rows = score(ctx, prompts, rows, n)
    rounds += 1
    drawn += len(prompts)
    std = rows["scores"].reshape(-1, n).std(axis=1)
    informative = (std > 0) | (n == 1)
    zero_var += int((~informative).sum())
    keep = informative if dynamic_sampling else np.ones_like(informative)
    for g in np.flatnonzero(keep):
      if len(kept_prompts) == num_prompts:
        break
      kept_prompts.append(prompts[g])
      kept_rows.append(take_rows(rows, np.arange(g * n, (g + 1) * n)))
  rows = concat_rows(kept_rows)
  stats = {"generation_rounds": rounds, "zero_variance_group_frac": zero_var / max(drawn, 1),
           "time_generate_s": gen_s, "time_score_s": time.perf_counter() - t0 - gen_s}
  return rows, kept_prompts, stats
