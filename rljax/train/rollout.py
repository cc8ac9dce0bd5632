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
from rljax.data.buffer import DynamicSamplingBuffer, DynamicSamplingError
from rljax.sampling import SamplingParams, generate


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

  def prompt_ids(self, prompt):
    """Ids of a prompt, left-truncated to the prompt columns (task.long_prompts="truncate")."""
    return prompt_ids(self.tokenizer, prompt.text,
                      chat_template=self.chat_template)[-self.prompt_len:]


def encode_prompts(ctx: RolloutContext, prompts):
  ids = [ctx.prompt_ids(p) for p in prompts]
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
    rows = sample(ctx, model, prompts, rng_fn())
    t1 = time.perf_counter()
    rows = score(ctx, prompts, rows, n)
    gen_s, score_s = gen_s + t1 - t0, score_s + time.perf_counter() - t1
    if zero_var is None:
      zero_var = _zero_variance_fraction(rows["accuracy"], n)
    if not dynamic_sampling:
      break
    rows["prompt"] = [prompts[i // n] for i in range(len(rows["texts"]))]
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
