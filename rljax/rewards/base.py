"""Reward-function protocol, weighted composition and failure containment.

A reward function is any callable `fn(prompt, completion) -> float` (or a mapping with a
`"total"` or `"score"` key; its other numeric keys are kept as extra components
`name/key`), where `prompt` has `.id` and `.answer` (`rljax.data.Prompt`) and
`completion` is the decoded completion text. A callable with the attribute
`batched = True` is called once per batch, `fn(prompts, completions) -> list`, and a
failure of that call fails its component on every sample. `compose` turns a list of
`(name, fn, weight)` into one scorer for a batch that returns the weighted total and each
component separately (so each is logged), and contains failures: a function that raises,
exceeds its deadline, returns something that is not a number (the string "0.5", a mapping
without a numeric "score") or a non-finite value is scored `failure_score` for that sample
(or re-raised, `on_failure="raise"`), counted per component, and reported with the prompt
id; the other samples and components are unaffected.

Note: a Python function that hangs runs on a worker thread that cannot be killed; after a
timeout it is abandoned (it keeps running in the background) and a fresh thread serves the
next call. Verifiers that may hang for real (math, code) run in subprocesses with hard
deadlines (`rljax.rewards.math`, `rljax.rewards.code`).
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

import numpy as np

FAILURE_MODES = ("score_failure", "raise")


class RewardFn(Protocol):
  def __call__(self, prompt: Any, completion: str) -> float | Mapping[str, float]: ...


class RewardFailure(NamedTuple):
  """One contained failure: which sample, which component, what happened."""
  index: int
  prompt_id: str
  component: str
  kind: str  # "exception" | "timeout" | "non_finite" | "not_a_number"
  message: str


class RewardError(RuntimeError):
  """Raised under `on_failure="raise"`; the message names the prompt id and component."""


class ComposedRewards(NamedTuple):
  """Scores of a batch.

  Attributes:
    total: float32 [B], Σ_k weight_k · component_k.
    components: name -> float32 [B] (unweighted), one entry per reward function, plus
      `name/key` for the other numeric keys of a function that returns a mapping (NaN
      where a sample did not report the key; not part of the total).
    failures: the contained failures, in batch order.
    failure_counts: name -> number of failed samples of that component.
  """
  total: np.ndarray
  components: dict[str, np.ndarray]
  failures: list[RewardFailure]
  failure_counts: dict[str, int]


@dataclasses.dataclass
class Composite:
  """Weighted sum of reward functions with failure containment (built by `compose`)."""
  terms: list[tuple[str, Callable, float]]
  on_failure: str = "score_failure"
  failure_score: float = 0.0
  timeout: float | None = 10.0

  def __post_init__(self):
    if self.on_failure not in FAILURE_MODES:
      raise ValueError(f"on_failure={self.on_failure!r}; valid: {list(FAILURE_MODES)}")
    names = [n for n, _, _ in self.terms]
    if len(set(names)) != len(names) or not names:
      raise ValueError(f"compose: component names must be unique and non-empty, got {names}")
    self._pool = None
    self.abandoned_threads = 0
    self.reported = set()   # kinds of failure already named to the user (by the trainer)

  def _call(self, fn, prompt, completion):
    if self.timeout is None:
      return fn(prompt, completion)
    if self._pool is None:
      self._pool = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="reward")
    future = self._pool.submit(fn, prompt, completion)
    try:
      return future.result(timeout=self.timeout)
    except cf.TimeoutError:
      self._pool.shutdown(wait=False)  # abandon the stuck thread; next call gets a new one
      self._pool = None
      self.abandoned_threads += 1
      raise

  def _failure(self, i, pid, name, error):
    """A RewardFailure for `error` (raised under on_failure="raise")."""
    if isinstance(error, cf.TimeoutError):
      failure = RewardFailure(i, pid, name, "timeout", f"no result within {self.timeout} s")
    elif isinstance(error, _NonFinite):
      failure = RewardFailure(i, pid, name, "non_finite", str(error))
    elif isinstance(error, _NotANumber):
      failure = RewardFailure(i, pid, name, "not_a_number", str(error))
    else:
      failure = RewardFailure(i, pid, name, "exception", f"{type(error).__name__}: {error}"[:500])
    if self.on_failure == "raise":
      raise RewardError(f"reward {name!r} failed on prompt {pid!r} (sample {i}): "
                        f"{failure.kind}: {failure.message}")
    return failure

  def _score_one(self, i, name, fn, prompt, completion):
    """-> (value, extra components, failure or None)."""
    pid = str(getattr(prompt, "id", i))
    try:
      value, extras = _value(self._call(fn, prompt, completion))
      return value, extras, None
    except Exception as e:  # noqa: BLE001  (contained and reported)
      return self.failure_score, {}, self._failure(i, pid, name, e)

  def _score_batch(self, name, fn, prompts, completions):
    """A batched term: -> ([(value, extras)] per sample, failures)."""
    try:
      out = list(self._call(fn, list(prompts), list(completions)))
      if len(out) != len(completions):
        raise ValueError(f"batched reward returned {len(out)} values for {len(completions)} "
                         "completions")
    except Exception as e:  # noqa: BLE001  (contained and reported)
      failures = [self._failure(i, str(getattr(p, "id", i)), name, e)
                  for i, p in enumerate(prompts)]
      return [(self.failure_score, {})] * len(prompts), failures
    values, failures = [], []
    for i, (p, o) in enumerate(zip(prompts, out)):
      try:
        values.append(_value(o))
      except Exception as e:  # noqa: BLE001
        values.append((self.failure_score, {}))
        failures.append(self._failure(i, str(getattr(p, "id", i)), name, e))
    return values, failures

  def __call__(self, prompts: Sequence[Any], completions: Sequence[str]) -> ComposedRewards:
    """Scores B (prompt, completion) pairs; `prompts[i]` belongs to `completions[i]`."""
    if len(prompts) != len(completions):
      raise ValueError(f"compose: {len(prompts)} prompts vs {len(completions)} completions")
    b = len(completions)
    comps = {name: np.zeros(b, np.float32) for name, _, _ in self.terms}
    failures = []
    for name, fn, _ in self.terms:
      if getattr(fn, "batched", False):
        scored, failed = self._score_batch(name, fn, prompts, completions)
        failures += failed
      else:
        scored = []
        for i, (p, c) in enumerate(zip(prompts, completions)):
          value, extras, failure = self._score_one(i, name, fn, p, c)
          scored.append((value, extras))
          if failure is not None:
            failures.append(failure)
      for i, (value, extras) in enumerate(scored):
        comps[name][i] = value
        for key, v in extras.items():   # NaN where a sample did not report this key
          comps.setdefault(f"{name}/{key}", np.full(b, np.nan, np.float32))[i] = v
    failures.sort(key=lambda f: f.index)
    total = np.zeros(b, np.float32)
    for name, _, w in self.terms:
      total += np.float32(w) * comps[name]
    counts = {name: sum(f.component == name for f in failures) for name, _, _ in self.terms}
    return ComposedRewards(total, comps, failures, counts)


class _NonFinite(ValueError):
  pass


class _NotANumber(TypeError):
  pass


def _number(out) -> float:
  """`out` as a float if it is a real number (int, float, bool, a NumPy scalar or a 0-d
  numeric array); raises `_NotANumber` for anything else, e.g. the string "0.5"."""
  if isinstance(out, numbers.Real):
    return float(out)
  if getattr(out, "shape", None) == () and np.issubdtype(np.asarray(out).dtype, np.number):
    return float(np.asarray(out))
  raise _NotANumber(f"returned {type(out).__name__} {out!r:.40}, not a number")


def _value(out) -> tuple[float, dict[str, float]]:
  """(score, extra numeric components) of one reward output: a number or a mapping whose
  "score" (or "total") is a number; raises on anything else and on a non-finite score."""
  extras = {}
  if isinstance(out, Mapping):
    key = "score" if "score" in out else "total"
    if key not in out:
      raise _NotANumber(f"returned a mapping without a 'score' (or 'total') key: {sorted(out)}")
    extras = {str(k): float(v) for k, v in out.items()
              if k != key and isinstance(v, int | float) and not isinstance(v, bool)}
    out = out[key]
  value = _number(out)
  if not math.isfinite(value):
    raise _NonFinite(f"returned {value}")
  return value, extras


def compose(terms: Sequence[tuple[str, Callable, float]], *, on_failure: str = "score_failure",
            failure_score: float = 0.0, timeout: float | None = 10.0) -> Composite:
  """Weighted composition of reward functions, each logged separately.

  total_i = Σ_k w_k · r_k(prompt_i, completion_i)   (DeepSeek-R1, arXiv:2501.12948,
  Sec. 2.2.2: accuracy reward + format reward).

  Args:
    terms: `(name, fn, weight)` triples; names unique.
    on_failure: "score_failure" (failed sample gets `failure_score`, counted, reported)
      or "raise" (RewardError naming the prompt id and component).
    failure_score: component value of a failed sample.
    timeout: per-call deadline in seconds (None: call inline, no deadline).
  Returns:
    a `Composite`; calling it on (prompts [B], completions [B]) gives `ComposedRewards`.
  """
  return Composite([(str(n), fn, float(w)) for n, fn, w in terms], on_failure,
                   float(failure_score), timeout)
