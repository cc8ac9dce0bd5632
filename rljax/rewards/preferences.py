"""Preference data for reward-model training: a JSONL file of ranked completions
(`read_preference_jsonl`, `encode_preferences`), or a generated set on the synthetic
arithmetic task (`make_preference_data`).

The generated set holds, for each prompt, K completions of known quality order
(`PREFERENCE_KINDS`, best first): the correct demonstration and corruptions of it (a wrong
step, a wrong final answer, no answer tag, truncated). Sequences use the layout of
`reward_model.encode_sequence`.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from rljax.data.batching import bucket_length
from rljax.rewards.reward_model import encode_sequence

# Quality order of the generated completions, best first (rank = index).
PREFERENCE_KINDS = ("correct", "wrong_step", "wrong_answer", "no_tag", "truncated")


class PreferenceData(NamedTuple):
  """A generated preference set.

  Attributes:
    train, heldout: {tokens int32 [N,K,S], attention_mask int32 [N,K,S], ranks int32 [N,K],
      mask int32 [N,K]}; one S for both splits.
    train_kinds, heldout_kinds: per prompt, the `PREFERENCE_KINDS` name of each slot
      ("" for a missing completion).
  """
  train: dict
  heldout: dict
  train_kinds: list
  heldout_kinds: list


def _corrupt(kind: str, demo: str, answer: str, rng: random.Random) -> str:
  """One completion of `kind` from the arithmetic demonstration `steps\\n<answer>a</answer>`."""
  steps = demo.split("\n")[:-1]
  delta = rng.choice([-3, -2, -1, 1, 2, 3])
  if kind == "correct":
    return demo
  if kind == "wrong_step":  # one step's result off, final answer still right and well formed
    i = rng.randrange(len(steps))
    lhs, value = steps[i].rsplit("=", 1)
    steps = steps[:i] + [f"{lhs}={int(value) + delta}"] + steps[i + 1:]
    return "\n".join(steps) + f"\n<answer>{answer}</answer>"
  if kind == "wrong_answer":
    return "\n".join(steps) + f"\n<answer>{int(answer) + delta}</answer>"
  if kind == "no_tag":
    return "\n".join(steps) + f"\n{answer}"
  if kind == "truncated":
    body = "\n".join(steps)
    return body[:rng.randint(1, max(1, len(body) - 1))]
  raise KeyError(f"unknown completion kind {kind!r}; valid: {list(PREFERENCE_KINDS)}")


def _prompt_rows(task, prompt, rng, k, k_min):
  n = rng.randint(k_min, k)
  kinds = ["correct"] + sorted(rng.sample(PREFERENCE_KINDS[1:], n - 1), key=PREFERENCE_KINDS.index)
  demo = task.demonstration(prompt)
  rows = [(kind, rank, _corrupt(kind, demo, prompt.answer, rng)) for rank, kind in enumerate(kinds)]
  rng.shuffle(rows)  # slot order carries no information
  return rows


class PreferenceExample(NamedTuple):
  """One prompt's ranked completions: `ranks[i]` is the rank of `completions[i]`, 0 = best
  (equal ranks are a tie: that pair is not trained on)."""
  prompt: str
  completions: list
  ranks: list


def encode_preferences(examples: Sequence[PreferenceExample], tokenizer, *, k: int | None = None,
                       seq_len: int | None = None, max_len: int | None = None) -> dict:
  """Token arrays of `examples` in `encode_sequence`'s layout.

  Args:
    examples: `PreferenceExample`s (a pair is 2 completions ranked [0, 1]).
    tokenizer: `CharTokenizer` or `HFTokenizer`.
    k: completion slots (default: the most any example has; fewer are masked).
    seq_len: padded length (default: `bucket_length` of the longest sequence).
    max_len: longest sequence kept; longer ones lose the start of the prompt.
  Returns:
    {tokens int32 [N,K,S], attention_mask int32 [N,K,S], ranks int32 [N,K], mask int32 [N,K]}.
  """
  ids = [[encode_sequence(tokenizer, e.prompt, c, max_len=max_len) for c in e.completions]
         for e in examples]
  k = k or max(len(e.completions) for e in examples)
  s = seq_len or bucket_length(max(len(row) for rows in ids for row in rows))
  n = len(examples)
  out = {"tokens": np.full((n, k, s), tokenizer.pad_id, np.int32),
         "attention_mask": np.zeros((n, k, s), np.int32),
         "ranks": np.full((n, k), k, np.int32), "mask": np.zeros((n, k), np.int32)}
  for i, (example, rows) in enumerate(zip(examples, ids)):
    for j, (rank, row) in enumerate(zip(example.ranks, rows)):
      out["tokens"][i, j, :len(row)] = row
      out["attention_mask"][i, j, :len(row)] = 1
      out["ranks"][i, j], out["mask"][i, j] = rank, 1
  return out


def _example(row, where: str) -> PreferenceExample:
  """A `PreferenceExample` from one JSON row, or a ValueError naming `where` and the field."""
  if not isinstance(row, dict):
    raise ValueError(f"{where}: a row must be a JSON object, got {type(row).__name__}")
  if not isinstance(row.get("prompt"), str):
    raise ValueError(f"{where}: field 'prompt' must be a string, got {row.get('prompt')!r:.60}")
  if "completions" in row:
    completions, ranks = row["completions"], row.get("ranks")
    if not isinstance(completions, list) or len(completions) < 2 or \
        not all(isinstance(c, str) for c in completions):
      raise ValueError(f"{where}: field 'completions' must be a list of >= 2 strings")
    if not isinstance(ranks, list) or len(ranks) != len(completions) or \
        not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in ranks):
      raise ValueError(f"{where}: field 'ranks' must be a list of {len(completions)} "
                       f"non-negative integers (0 = best), one per completion, got {ranks!r:.60}")
    return PreferenceExample(row["prompt"], completions, ranks)
  for field in ("chosen", "rejected"):
    if not isinstance(row.get(field), str):
      raise ValueError(f"{where}: field {field!r} must be a string (a row is {{prompt, chosen, "
                       f"rejected}} or {{prompt, completions, ranks}})")
  return PreferenceExample(row["prompt"], [row["chosen"], row["rejected"]], [0, 1])


def read_preference_jsonl(path: str) -> list[PreferenceExample]:
  """Rows `{"prompt", "chosen", "rejected"}` (a pair) or `{"prompt", "completions": [...],
  "ranks": [...]}` (a K-wise ranking, 0 = best) of a JSONL file; blank lines are skipped.

  Raises:
    FileNotFoundError; ValueError naming the line and the field of a bad row.
  """
  examples = []
  with open(path) as f:
    for line_no, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        row = json.loads(line)
      except json.JSONDecodeError as e:
        raise ValueError(f"{path} line {line_no}: not JSON ({e.msg})") from e
      examples.append(_example(row, f"{path} line {line_no}"))
  if not examples:
    raise ValueError(f"{path}: no preference rows")
  return examples


def _assemble(rows_per_prompt, prompts, tokenizer, k, s):
  kinds = [[kind for kind, _, _ in rows] + [""] * (k - len(rows)) for rows in rows_per_prompt]
  examples = [PreferenceExample(p.text, [t for _, _, t in rows], [r for _, r, _ in rows])
              for p, rows in zip(prompts, rows_per_prompt)]
  return encode_preferences(examples, tokenizer, k=k, seq_len=s), kinds


def make_preference_data(task, tokenizer, *, n_prompts: int, k: int, seed: int,
                         n_heldout: int | None = None, k_min: int | None = None) -> PreferenceData:
  """K ranked completions per prompt of the synthetic arithmetic task.

  Per prompt: the correct demonstration plus K-1 corruptions drawn from (wrong
  intermediate step but right answer and format, wrong final answer, missing answer tag,
  truncated), ranked by the known order `PREFERENCE_KINDS` (correct best).

  Args:
    task: an arithmetic `rljax.data.Task` (training prompts from `train_prompts()`,
      held-out prompts from `heldout_prompts()`, disjoint by construction).
    tokenizer: `CharTokenizer`-like.
    n_prompts: training prompts (at most the task's).
    k: K completions per prompt, 2..5.
    seed: seed of the corruptions.
    n_heldout: held-out prompts (default: all of the task's).
    k_min: if set, each prompt gets a uniform number in [k_min, k] (the rest masked).
  Returns:
    `PreferenceData`.
  """
  if not 2 <= k <= len(PREFERENCE_KINDS):
    raise ValueError(f"make_preference_data: k={k}; need 2 <= k <= {len(PREFERENCE_KINDS)}")
  k_min = k if k_min is None else k_min
  if not 2 <= k_min <= k:
    raise ValueError(f"make_preference_data: k_min={k_min}; need 2 <= k_min <= k={k}")
  if task.name != "arithmetic":
    raise ValueError(f"make_preference_data: needs the arithmetic task, got {task.name!r}")
  splits = {"train": task.train_prompts()[:n_prompts],
            "heldout": task.heldout_prompts()[:n_heldout]}
  rng = random.Random(seed)
  rows = {name: [_prompt_rows(task, p, rng, k, k_min) for p in ps] for name, ps in splits.items()}
  longest = max(len(encode_sequence(tokenizer, p.text, text))
                for name, ps in splits.items() for p, r in zip(ps, rows[name]) for _, _, text in r)
  s = bucket_length(longest)
  (train, train_kinds), (held, held_kinds) = (
      _assemble(rows[name], splits[name], tokenizer, k, s) for name in ("train", "heldout"))
  return PreferenceData(train, held, train_kinds, held_kinds)


# ----------------------------------------------------------------- checkpoints, scorer
