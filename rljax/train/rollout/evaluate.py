"""Evaluation: greedy accuracy, avg@n, unbiased pass@k, and the per-prompt results an
ablation pairs by prompt, on the held-out split and on the named evaluation sets.

Named evaluation sets (`eval.sets`) are other prompt sources, evaluated like the held-out
split (`evaluate`) with their own verifier, prompt columns and completion budget, and
logged under their name (`eval/<name>/<metric>`; result.json `heldout_<name>/<metric>`).
`rljax.train.run.build` makes them from the specs (`rljax.train.config.specs.EvalSetSpec`);
the run's own held-out split is not one of them (it keeps its `eval/<metric>` keys).
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from rljax.data.batching import bucket_length
from rljax.ops.stats import pass_at_k
from rljax.train.config.specs import EvalSetSpec
from rljax.train.rollout.context import RolloutContext, prompt_ids

# pass@k reported from the large-k subset (powers of two above the main sample count)
_PASSK_CHUNK_ROWS = 2048


def _pass_at(n, correct_counts, k) -> float:
  return float(np.mean(np.asarray(pass_at_k(n, np.asarray(correct_counts), k))))


def _greedy_and_sampled(rollouts, model, prompts, rng, n, temperature, batch_size):
  """(greedy correct [N], sampled correct counts [N] of n, format [N], lengths [N], tool use
  [N] or None) over `prompts`, in chunks of `batch_size` prompts."""
  greedy = rollouts.ctx.sampling.replace(greedy=True, n=1)
  sampled = rollouts.ctx.sampling.replace(n=n, temperature=temperature) if n > 0 else None
  acc, fmt, lengths, correct, tools = [], [], [], [], []
  keys = jax.random.split(rng, (len(prompts) + batch_size - 1) // batch_size)
  for i, start in enumerate(range(0, len(prompts), batch_size)):
    chunk = prompts[start:start + batch_size]
    batch = rollouts.sample_and_score(model, chunk, keys[i], sampling=greedy)
    acc.append(batch.accuracy)
    fmt.append(batch.format)
    lengths.append(batch.lengths)
    tools.append(batch.tool_use())
    if n > 0:
      batch = rollouts.sample_and_score(model, chunk, keys[i], sampling=sampled)
      correct.append(np.asarray(batch.accuracy).reshape(-1, n).sum(axis=1))
  tool_use = np.concatenate(tools) if tools and all(t is not None for t in tools) else None
  counts = np.concatenate(correct) if correct else np.zeros(len(prompts), np.int64)
  return (np.concatenate(acc), counts, np.concatenate(fmt), np.concatenate(lengths), tool_use)


def _passk_counts(rollouts, model, prompts, rng, n, temperature):
  """Correct counts [M] of n samples per prompt (the large-k subset), in chunks of rows."""
  sampling = rollouts.ctx.sampling.replace(n=n, temperature=temperature)
  per_chunk = max(1, _PASSK_CHUNK_ROWS // n)
  counts = []
  for i, start in enumerate(range(0, len(prompts), per_chunk)):
    batch = rollouts.sample_and_score(model, prompts[start:start + per_chunk],
                                      jax.random.fold_in(rng, i), sampling=sampling)
    counts.append(np.asarray(batch.accuracy).reshape(-1, n).sum(axis=1))
  return np.concatenate(counts)


def evaluate_per_prompt(rollouts, model, prompts, rng, *, n, temperature, passk_n=0,
                        passk_prompts=0, batch_size=256):
  """Scores `model` on `prompts` with the run's rollouts (single-turn or episodic).

  Every prompt's samples draw from (prompt, sample index) streams, so two policies are
  compared on the same prompts with the same sampling noise (the paired evaluation of an
  ablation).

  Args:
    n: samples per prompt for avg@n and pass@k, k <= n (Chen et al. 2021, arXiv:2107.03374,
      Eq. 1, unbiased).
    passk_n: samples per prompt of the large-k subset (0: off): pass@k for the powers of
      two n < k <= passk_n on the first `passk_prompts` prompts (the narrowing of pass@large-k
      under RL, Yue et al. 2025, arXiv:2504.13837).
  Returns:
    (summary, per_prompt): summary has `accuracy` (greedy), `avg@n`, `pass@k`, `format`,
    `response_length_mean`, and `tool_use` (multi-turn: share of greedy episodes that called
    a tool); per_prompt has `greedy_correct` [N], `correct` [N] (of n), `passk_correct` [M]
    (of passk_n) as NumPy.
  """
  greedy, counts, fmt, lengths, tool_use = _greedy_and_sampled(
      rollouts, model, prompts, rng, n, temperature, batch_size)
  out = {"accuracy": float(np.mean(greedy)), "format": float(np.mean(fmt)),
         "response_length_mean": float(np.mean(lengths))}
  if tool_use is not None:
    out["tool_use"] = float(np.mean(tool_use))
  per_prompt = {"greedy_correct": np.asarray(greedy, np.float32), "correct": counts}
  if n > 0:
    out[f"avg@{n}"] = float(np.mean(counts) / n)
    for k in range(1, n + 1):
      out[f"pass@{k}"] = _pass_at(n, counts, k)
  if passk_n > n:
    subset = prompts[:passk_prompts or len(prompts)]
    large = _passk_counts(rollouts, model, subset, jax.random.fold_in(rng, 0x9A55), passk_n,
                          temperature)
    per_prompt["passk_correct"] = large
    k = 2 ** (int(np.log2(max(n, 1))) + 1)
    while k <= passk_n:
      out[f"pass@{k}"] = _pass_at(passk_n, large, k)
      k *= 2
  return out, per_prompt


def evaluate(rollouts, model, prompts, rng, *, n, temperature, batch_size=256):
  """The summary of `evaluate_per_prompt` (without the large-k subset)."""
  return evaluate_per_prompt(rollouts, model, prompts, rng, n=n, temperature=temperature,
                             batch_size=batch_size)[0]


@dataclasses.dataclass(frozen=True)
class EvalSet:
  """One named set: its spec, the run's rollout over the set's context, and its prompts."""

  spec: EvalSetSpec
  rollouts: object
  prompts: tuple


def eval_context(ctx: RolloutContext, task, prompts, reward_fn, *, budget: int,
                 max_positions: int) -> RolloutContext:
  """The run's rollout context for another prompt source: its task and verifier, prompt
  columns that fit its longest prompt (a shape bucket) and `budget` completion tokens, cut
  to what the model's positions leave.

  Raises:
    ValueError: the source's prompts leave no completion room within `max_positions`.
  """
  longest = max(len(prompt_ids(ctx.tokenizer, p.text, chat_template=ctx.chat_template))
                for p in prompts)
  prompt_len = bucket_length(longest)
  budget = min(budget, max_positions - prompt_len)
  if budget < 1:
    raise ValueError(f"an evaluation set of task {getattr(task, 'name', task)!r} has "
                     f"{longest}-token prompts: no room left within the model's "
                     f"{max_positions} positions")
  return ctx.replace(task=task, prompt_len=prompt_len, reward_fn=reward_fn,
                     sampling=ctx.sampling.replace(max_new_tokens=budget))


def training_overlap(prompts, train_prompts) -> int:
  """How many of `prompts` have the text of a training prompt (an evaluation set that
  scores what the run trains on measures memory, not generalisation)."""
  seen = {p.text for p in train_prompts}
  return sum(p.text in seen for p in prompts)


def overlap_warning(name: str, prompts, train_prompts) -> str:
  """The warning for the evaluation set `name` when it shares prompts with training, or ""."""
  shared = training_overlap(prompts, train_prompts)
  if not shared:
    return ""
  return (f"[rljax] warning: eval.sets.{name}: {shared} of its {len(prompts)} prompts are "
          "training prompts (the same text): its scores are partly on prompts the run "
          "trains on")


GREEDY_KEYS = ("accuracy", "format", "response_length_mean", "tool_use")


def evaluate_sets(sets, model, rng) -> dict:
  """Every set's `evaluate` metrics as `{"<name>/<metric>": value}`: avg@k and pass@1..k of
  its k samples at its temperature, and the greedy completion's accuracy, format and length
  when the set asks for them.

  Note: `evaluate` decodes the greedy completion either way; a set with `greedy=False`
  leaves its keys out.
  """
  out = {}
  for i, s in enumerate(sets):
    metrics = evaluate(s.rollouts, model, list(s.prompts), jax.random.fold_in(rng, i + 1),
                       n=s.spec.k, temperature=s.spec.temperature)
    out.update({f"{s.spec.name}/{k}": v for k, v in metrics.items()
                if s.spec.greedy or k not in GREEDY_KEYS})
  return out
