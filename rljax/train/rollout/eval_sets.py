"""Named evaluation sets (`eval.sets`): other prompt sources, evaluated like the held-out
split (`evaluate`) with their own verifier, prompt columns and completion budget, and
logged under their name (`eval/<name>/<metric>`; result.json `heldout_<name>/<metric>`).

`rljax.train.run.build` makes them from the specs (`rljax.train.config.specs.EvalSetSpec`);
the run's own held-out split is not one of them (it keeps its `eval/<metric>` keys).
"""

from __future__ import annotations

import dataclasses

import jax

from rljax.data.batching import bucket_length
from rljax.train.config.specs import EvalSetSpec
from rljax.train.rollout.context import RolloutContext, prompt_ids
from rljax.train.rollout.evaluate import evaluate


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
