"""A task over your own JSONL prompts: `{"prompt": ..., "answer": ..., "solution": ...}` rows.

Accuracy uses `rljax.rewards.math.is_equivalent` on the `<answer>` content (or the
extracted final answer when there is no tag); the format reward checks for exactly one
`<answer>...</answer>` block. The held-out split is a fixed hash bucket of the prompt
text (same rule as the synthetic tasks), so it never overlaps training. An optional
`solution` field is the SFT demonstration.
"""

from __future__ import annotations

import hashlib

from rljax.data.jsonl import load_jsonl_prompts
from rljax.data.tasks import RewardBreakdown, parse_answer_tag
from rljax.rewards.math import extract_answer, is_equivalent


class JsonlTask:
  """Task interface (`train_prompts`, `heldout_prompts`, `demonstration`, `score`) over a file."""

  name = "jsonl"

  def __init__(self, path: str, *, heldout_fraction: float = 0.1, n_heldout: int = 256,
               format_weight: float = 0.1, solution_field: str = "solution"):
    import json

    self.path, self.format_weight = path, format_weight
    prompts = load_jsonl_prompts(path)
    self._solutions = {}
    with open(path, encoding="utf-8") as f:
      for line, p in zip((x for x in f if x.strip()), prompts):
        solution = json.loads(line).get(solution_field)
        if solution is not None:
          self._solutions[p.id] = str(solution)

    def bucket(p):
      return int(hashlib.sha256(p.text.encode()).hexdigest()[:8], 16) % 1000

    cut = round(heldout_fraction * 1000)
    self._train = [p for p in prompts if bucket(p) >= cut]
    self._heldout = [p for p in prompts if bucket(p) < cut][:n_heldout]
    if not self._train or not self._heldout:
      raise ValueError(f"{path}: {len(prompts)} prompts give {len(self._train)} train and "
                       f"{len(self._heldout)} held-out prompts; need at least one of each")
    self.max_prompt_len = max(len(p.text) for p in prompts)
    self.max_completion_len = max((len(s) for s in self._solutions.values()), default=0)
    self.difficulty_range = (min(p.difficulty for p in prompts),
                             max(p.difficulty for p in prompts))

  def train_prompts(self):
    return self._train

  def heldout_prompts(self):
    return self._heldout

  def demonstration(self, prompt) -> str:
    if prompt.id not in self._solutions:
      raise ValueError(f"{self.path}: prompt {prompt.id} has no 'solution' field, which SFT "
                       "(sft.steps > 0) and ptx (algo.ptx_coef > 0) need")
    return self._solutions[prompt.id]

  def score(self, prompt, completion: str) -> RewardBreakdown:
    content, well_formed = parse_answer_tag(completion)
    answer = content if content is not None else extract_answer(completion)
    accuracy = float(bool(answer) and is_equivalent(answer, prompt.answer))
    fmt = float(well_formed)
    return RewardBreakdown(total=accuracy + self.format_weight * fmt, accuracy=accuracy,
                           format=fmt)
