"""What every rollout needs besides the policy: the task, the tokenizer, the prompt columns,
the sampling parameters, the reward, and where the rows live; and prompts and
demonstrations as token rows (the SFT warm start's and the ptx term's batches).
"""

from __future__ import annotations

import dataclasses
import zlib

import jax
import numpy as np

from rljax.data.batching import left_pad
from rljax.parallel import batch_sharding, batch_shards
from rljax.sampling import SamplingParams, buckets


def prompt_ids(tokenizer, text, *, chat_template=False):
  """Token ids of one prompt: `[bos] + text` (no bos when the tokenizer has none, e.g.
  Qwen), or the text as one user turn of the tokenizer's chat template (which brings its
  own special tokens) followed by the assistant header."""
  if chat_template:
    return tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": text}]))
  return ([] if tokenizer.bos_id is None else [tokenizer.bos_id]) + tokenizer.encode(text)


@dataclasses.dataclass(frozen=True)
class RolloutContext:
  """What a rollout needs besides the policy (built once per run).

  Attributes:
    task: the task (prompts, `score`, demonstrations).
    prompt_len: P, the prompt columns (a shape bucket).
    sampling: the training rollout's `SamplingParams` (n samples per prompt, T columns).
    reward_fn: `rljax.rewards.base.Composite`, (prompts, texts) -> ComposedRewards.
    mesh: rows are split over its batch axes (None: one device).
    sampler_dtype: "" (the policy's own) or e.g. "bfloat16": every rollout (training and
      evaluation) samples with a copy of the policy cast to it (`sampling.sampler_dtype`).
    worked_demonstrations: the task's demonstrations have a worked mode
      (`demonstration(worked=True)`: arithmetic's scratchpad, the calculator's tool call),
      which the first phase of the SFT warm start shows (`sft.worked_steps`).
  """

  task: object
  tokenizer: object
  prompt_len: int
  sampling: SamplingParams
  reward_fn: object
  chat_template: bool = False
  mesh: object = None
  sampler_dtype: str = ""
  worked_demonstrations: bool = False

  def prompt_ids(self, prompt):
    """Ids of a prompt, left-truncated to the prompt columns (task.long_prompts="truncate")."""
    return prompt_ids(self.tokenizer, prompt.text,
                      chat_template=self.chat_template)[-self.prompt_len:]

  def replace(self, **changes) -> RolloutContext:
    return dataclasses.replace(self, **changes)


def encode_prompts(ctx: RolloutContext, prompts):
  """Left-padded prompt ids and mask, int32 [len(prompts), P]."""
  return left_pad([ctx.prompt_ids(p) for p in prompts], pad_id=ctx.tokenizer.pad_id,
                  length=ctx.prompt_len)


def row_layout(ctx: RolloutContext, num_rows: int):
  """(sharding, R): rows split over the mesh's batch axes, R = num_rows rounded up to a
  multiple of the batch shards (R = B for a training batch, which validation checks)."""
  if ctx.mesh is None:
    return jax.sharding.SingleDeviceSharding(jax.devices()[0]), num_rows
  return (batch_sharding(ctx.mesh),
          buckets.round_up(num_rows, None, multiple_of=batch_shards(ctx.mesh)))


def score_texts(ctx: RolloutContext, prompts, texts):
  """The run's reward on decoded completions, failures reported with their prompt.

  Args:
    prompts: the prompt of each row.
    texts: the decoded completion of each row.
  Returns:
    (total float [R], components {name: float [R]}, failed int [R]) as NumPy.
  """
  rewards = ctx.reward_fn(prompts, texts)
  failed = np.zeros(len(prompts), np.int32)
  for failure in rewards.failures:
    failed[failure.index] = 1
  # the run's reward keeps the kinds of failure it has named (`Composite.reported`)
  reported = getattr(ctx.reward_fn, "reported", set())
  for line in failure_lines(rewards.failures, len(prompts), reported):
    print(line)
  return np.asarray(rewards.total), dict(rewards.components), failed


def failure_lines(failures, batch_size: int, reported: set) -> list[str]:
  """One line per kind of reward failure (component, kind, error type) not in `reported`,
  which gains it: a function that returns a string fails the same way on every sample of
  every batch, and is named once, with how many samples of this batch it failed and one
  prompt id; the count per iteration is `train/reward_failures`."""
  groups = {}
  for f in failures:
    groups.setdefault((f.component, f.kind, f.message.split(":")[0]), []).append(f)
  lines = []
  for key, group in groups.items():
    if key in reported:
      continue
    reported.add(key)
    f = group[0]
    lines.append(f"[rljax] reward {f.component!r} failed on {len(group)} of {batch_size} "
                 f"samples (first: prompt {f.prompt_id}): {f.kind}: {f.message} (reported "
                 "once; counted every iteration in train/reward_failures)")
  return lines


def prompt_stream(prompt) -> int:
  """The random stream of a prompt: a 31-bit hash of its id (stable across runs, processes
  and Python versions)."""
  return zlib.crc32(str(prompt.id).encode()) & 0x7FFFFFFF


def row_streams(prompts, n: int, rows: int) -> np.ndarray:
  """int32 [rows, 2]: (prompt stream, sample index) of rows i < len(prompts)·n (sample
  i % n of prompt i // n); padding rows get streams no prompt has."""
  b = len(prompts) * n
  streams = np.stack([np.full(rows, -1, np.int64), np.arange(rows)], axis=1)
  streams[:b, 0] = np.repeat([prompt_stream(p) for p in prompts], n)
  streams[:b, 1] = np.tile(np.arange(n), len(prompts))
  return streams.astype(np.int32)


def demonstration_batch(ctx, prompts, completion_len, *, worked=False):
  """Prompt + demonstration rows in the rollout layout (prompt left-padded, completion right).

  worked=True: the worked solution of every prompt (`Task.demonstration(worked=True)`).
  """
  tok = ctx.tokenizer
  p_ids = [ctx.prompt_ids(p) for p in prompts]
  prompt_tokens, prompt_mask = left_pad(p_ids, pad_id=tok.pad_id, length=ctx.prompt_len)
  tokens = np.full((len(prompts), completion_len), tok.pad_id, np.int32)
  mask = np.zeros((len(prompts), completion_len), np.int32)
  observation_re = getattr(ctx.task, "observation_re", None)
  for i, p in enumerate(prompts):
    demo = ctx.task.demonstration(p, worked=True) if worked else ctx.task.demonstration(p)
    ids, keep = demonstration_ids(tok, demo, observation_re)
    ids, keep = (ids + [tok.eos_id])[:completion_len], (keep + [1])[:completion_len]
    tokens[i, :len(ids)] = ids
    mask[i, :len(ids)] = keep
  return {"prompt_tokens": prompt_tokens, "prompt_mask": prompt_mask, "tokens": tokens,
          "mask": mask}


def demonstration_ids(tokenizer, text, observation_re=None):
  """(ids, loss mask) of a demonstration: spans matching `observation_re` (what an
  environment writes, e.g. a tool's `<result>...</result>`) are encoded separately, as the
  multi-turn rollout appends them, and carry no loss."""
  if observation_re is None:
    ids = tokenizer.encode(text)
    return ids, [1] * len(ids)
  ids, keep, pos = [], [], 0
  for match in observation_re.finditer(text):
    for piece, trained in ((text[pos:match.start()], 1), (match.group(0), 0)):
      piece_ids = tokenizer.encode(piece) if piece else []
      ids += piece_ids
      keep += [trained] * len(piece_ids)
    pos = match.end()
  tail = tokenizer.encode(text[pos:]) if text[pos:] else []
  return ids + tail, keep + [1] * len(tail)
