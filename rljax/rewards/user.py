"""Your own reward functions from the config: `task.reward_fns = ["module:fn", "file.py:fn"]`.

Each function is called as `fn(prompt: str, completion: str, answer: str)` and returns a
float, or a dict whose `"score"` is the reward (its other numeric keys are logged as
`reward/<fn>/<key>`). A function with the attribute `batched = True` is called once per
batch as `fn(prompts: list, completions: list, answers: list) -> list` (TRL's
`reward_funcs` convention). Rewards are combined by `task.reward_weights` (default 1
each) and contained like the built-in verifiers (`rljax.rewards.base`): a function that
raises, hangs or returns NaN scores `failure_score` on that sample and is counted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from rljax.plugins import load_object


@dataclasses.dataclass
class UserReward:
  """Adapts `fn(prompt_text, completion, answer)` to the `compose` protocol `(prompt, completion)`."""

  fn: Callable
  name: str

  @property
  def batched(self) -> bool:
    return bool(getattr(self.fn, "batched", False))

  def __call__(self, prompt, completion):
    if self.batched:   # compose passes lists for a batched term
      return self.fn([p.text for p in prompt], list(completion), [p.answer for p in prompt])
    return self.fn(prompt.text, completion, prompt.answer)


def user_reward_terms(specs: Sequence[str], weights: Sequence[float] = (), *,
                      field: str = "task.reward_fns") -> list[tuple[str, UserReward, float]]:
  """`(name, reward, weight)` terms for `rljax.rewards.base.compose`.

  Args:
    specs: `"module.path:fn"` or `"path/to/file.py:fn"` each.
    weights: one weight per spec (empty: 1.0 each).
  Returns:
    terms named after the functions (`fn`, or `fn_2`, ... when two share a name).
  Raises:
    ValueError: a spec that does not load or is not callable, or weights of the wrong length.
  """
  weights = list(weights) or [1.0] * len(specs)
  if len(weights) != len(specs):
    raise ValueError(f"task.reward_weights has {len(weights)} entries for {len(specs)} "
                     f"{field} ({list(specs)})")
  terms, seen = [], {}
  for spec, weight in zip(specs, weights):
    fn = load_object(spec, field=field)
    if not callable(fn):
      raise ValueError(f"{field}: {spec!r} is a {type(fn).__name__}, not a function")
    base = getattr(fn, "__name__", type(fn).__name__)
    seen[base] = seen.get(base, 0) + 1
    name = base if seen[base] == 1 else f"{base}_{seen[base]}"
    terms.append((name, UserReward(fn, name), float(weight)))
  return terms
