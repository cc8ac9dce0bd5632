"""A task over dict rows from any source (JSONL, Hugging Face `datasets`, TFDS).

Rows hold a prompt, a ground-truth answer and optionally a worked solution, under
configurable field names (GSM8K: `question` / `answer`; MATH: `problem` / `solution`).
Accuracy uses `rljax.rewards.math.is_equivalent` on the `<answer>` content (or the
extracted final answer when there is no tag); the format reward checks for exactly one
`<answer>...</answer>` block. The held-out split is a fixed hash bucket of the prompt
text (same rule as the synthetic tasks), so it never overlaps training and does not
depend on row order. The solution field, when present, is the SFT demonstration.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence

from rljax.answers import extract_answer, is_equivalent, parse_answer_tag
from rljax.data.jsonl import row_to_prompt
from rljax.data.tasks import RewardBreakdown


def _whole(raw: str) -> str:
  return raw.strip()


def _after_hashes(raw: str) -> str:
  """GSM8K: the text after the last `####`, thousands separators removed ("1,200" -> "1200")."""
  return raw.rsplit("####", 1)[1].strip().replace(",", "") if "####" in raw else ""


def _last_boxed(raw: str) -> str:
  """MATH: the content of the last `\\boxed{...}` (or `\\fbox{...}`); "" when there is none."""
  return extract_answer(raw) if re.search(r"\\(?:boxed|fbox)\s*\{", raw) else ""


def tagged_demonstration(solution: str, answer: str) -> str:
  """The solution in the format the format reward checks: ending in `<answer>answer</answer>`.

  A solution that already has an `<answer>` block is kept as is; a trailing GSM8K
  `#### 72` line is replaced by the tag; any other solution (e.g. MATH's, ending in a
  `\\boxed{}`) gets the tag appended, so SFT never teaches a format RL then penalises.
  """
  if "<answer>" in solution:
    return solution
  body = solution.rsplit("####", 1)[0] if "####" in solution else solution
  return f"{body.rstrip()}\n<answer>{answer}</answer>"


# task.answer_extractor -> raw answer-field text -> ground-truth answer ("" = not found).
ANSWER_EXTRACTORS: dict[str, Callable[[str], str]] = {
    "none": _whole, "gsm8k": _after_hashes, "boxed": _last_boxed, "regex": _whole,
}


def make_answer_extractor(name: str = "none", regex: str = "") -> Callable[[str], str]:
  """The function that turns an answer field into the ground truth.

  Args:
    name: a key of `ANSWER_EXTRACTORS`: "none" (the whole field, stripped), "gsm8k" (after
      the last "####", commas dropped), "boxed" (last `\\boxed{}`), "regex" (`regex`).
    regex: for "regex": a pattern with one group; the group of its last match is the answer.
  Raises:
    ValueError: unknown name, or a regex that does not compile or has no group.
  """
  if name not in ANSWER_EXTRACTORS:
    raise ValueError(f"task.answer_extractor={name!r} is not one of {list(ANSWER_EXTRACTORS)}")
  if name != "regex":
    return ANSWER_EXTRACTORS[name]
  try:
    pattern = re.compile(regex, re.DOTALL)
  except re.error as e:
    raise ValueError(f"task.answer_regex={regex!r} does not compile: {e}") from e
  if pattern.groups < 1:
    raise ValueError(f"task.answer_regex={regex!r} needs a capture group, e.g. r'answer: (\\S+)'")

  def last_group(raw: str) -> str:
    matches = list(pattern.finditer(raw))
    return (matches[-1].group(1) or "").strip() if matches else ""
  return last_group


def _text(value) -> str:
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def heldout_bucket(text: str) -> int:
  """Bucket in [0, 1000) of a prompt text; buckets below 1000 * fraction are held out."""
  return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16) % 1000


class RecordsTask:
  """Task interface (`train_prompts`, `heldout_prompts`, `demonstration`, `score`) over rows.

  Args:
    rows: dict rows (str or bytes values; numbers become strings).
    source: name used in prompt ids and errors, e.g. "gsm8k[train]".
    where: optional per-row location for errors and ids (default "<source>:<row index>").
    prompt_field, answer_field, solution_field: field names (task.prompt_field, ...); the
      solution field may be missing from some or all rows (then no SFT demonstration).
    answer_extractor, answer_regex: how the answer field becomes the ground truth
      (see `make_answer_extractor`).
    prompt_template: "" or a string containing "{prompt}", which is replaced by the prompt
      field (e.g. an instruction to end with `<answer>...</answer>`).
    heldout_fraction, n_heldout: held-out hash-bucket fraction and size cap.
    format_weight: weight of the format reward in `total`.
  Raises:
    ValueError: no rows, a row without the prompt/answer field (naming the config field),
      an answer the extractor finds nothing in, or an empty train or held-out split.
  """

  name = "records"

  def __init__(self, rows: Sequence[dict], *, source: str, where: Sequence[str] | None = None,
               prompt_field: str = "prompt", answer_field: str = "answer",
               solution_field: str = "solution", answer_extractor: str = "none",
               answer_regex: str = "", prompt_template: str = "",
               heldout_fraction: float = 0.1, n_heldout: int = 256, format_weight: float = 0.1):
    if not rows:
      raise ValueError(f"{source}: no rows")
    self.source, self.format_weight = source, format_weight
    self.solution_field = solution_field
    extract = make_answer_extractor(answer_extractor, answer_regex)
    where = where or [f"{source}:{i}" for i in range(len(rows))]
    prompts, raw_texts, self._solutions = [], [], {}
    for loc, row in zip(where, rows):
      raw_text, prompt = self._row_prompt(row, loc, prompt_field, answer_field, extract,
                                          answer_extractor, prompt_template)
      if row.get(solution_field) is not None:
        self._solutions[prompt.id] = _text(row[solution_field])
      prompts.append(prompt)
      raw_texts.append(raw_text)
    cut = round(heldout_fraction * 1000)
    held = [heldout_bucket(t) < cut for t in raw_texts]
    self._train = [p for p, h in zip(prompts, held) if not h]
    self._heldout = [p for p, h in zip(prompts, held) if h][:n_heldout]
    if not self._train or not self._heldout:
      raise ValueError(f"{source}: {len(prompts)} prompts give {len(self._train)} train and "
                       f"{len(self._heldout)} held-out prompts; need at least one of each")
    self.max_prompt_len = max(len(p.text) for p in prompts)
    self.max_completion_len = max((len(s) for s in self._solutions.values()), default=0)
    self.difficulty_range = (1, 1)

  @staticmethod
  def _row_prompt(row, where, prompt_field, answer_field, extract, extractor_name, template):
    if not isinstance(row, dict):
      raise ValueError(f"{where}: expected a JSON object / dict, got {type(row).__name__}")
    for config_field, key in (("task.prompt_field", prompt_field),
                              ("task.answer_field", answer_field)):
      if key not in row:
        raise ValueError(f"{where}: missing field(s) [{key!r}] ({config_field}={key!r}); the "
                         f"row has {sorted(row)}")
    raw_answer = _text(row[answer_field])
    answer = extract(raw_answer)
    if not answer:
      raise ValueError(f"{where}: task.answer_extractor={extractor_name!r} finds no answer in "
                       f"field {answer_field!r}: {raw_answer[-80:]!r}")
    fill = (lambda t: template.replace("{prompt}", t)) if template else None
    prompt = row_to_prompt({prompt_field: row[prompt_field], answer_field: answer}, where,
                           text_field=prompt_field, answer_field=answer_field, template=fill)
    return _text(row[prompt_field]), prompt

  def train_prompts(self):
    return self._train

  def heldout_prompts(self):
    return self._heldout

  def demonstration(self, prompt) -> str:
    if prompt.id not in self._solutions:
      raise ValueError(f"{self.source}: prompt {prompt.id} has no {self.solution_field!r} field "
                       "(task.solution_field), which SFT (sft.steps > 0) and ptx "
                       "(algo.ptx_coef > 0) need")
    return tagged_demonstration(self._solutions[prompt.id], prompt.answer)

  def score(self, prompt, completion: str) -> RewardBreakdown:
    content, well_formed = parse_answer_tag(completion)
    answer = content if content is not None else extract_answer(completion)
    accuracy = float(bool(answer) and is_equivalent(answer, prompt.answer))
    fmt = float(well_formed)
    return RewardBreakdown(total=accuracy + self.format_weight * fmt, accuracy=accuracy,
                           format=fmt)
