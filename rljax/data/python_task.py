"""Your own task in Python: `task.name = "python"`, `task.python = "module:factory"`.

The factory (called with no arguments) returns an object with

    train_prompts()   -> list of prompts
    heldout_prompts() -> list of prompts (never trained on)
    score(prompt, completion) -> float, or a dict with "score" (and optionally
                                 "accuracy", "format" and other numeric keys)
    demonstration(prompt) -> str    (optional: the SFT target, needed when sft.steps > 0)

A prompt is a `rljax.data.Prompt`, a dict `{"prompt" (or "text"), "answer", "id"}` ("answer"
and "id" optional) or a plain string; `score` and `demonstration` get back the object the
lists held. The same object serves SFT, RL and evaluation.
`accuracy` (the held-out metric and the dynamic-sampling filter) is the dict's
"accuracy", or the score itself when `score` returns a float. See
`experiments/user_task.py` for a complete example.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping

from rljax.data.tasks import Prompt, RewardBreakdown
from rljax.plugins import load_object

FIELD = "task.python"


def _as_prompt(item, where: str) -> Prompt:
  if isinstance(item, Prompt):
    return item
  if isinstance(item, str):
    text, answer, pid = item, "", None
  elif isinstance(item, Mapping):
    key = "prompt" if "prompt" in item else "text"
    if key not in item:
      raise ValueError(f"{FIELD}: {where} is a dict without a 'prompt' (or 'text') key: "
                       f"{sorted(item)}")
    text, answer, pid = str(item[key]), str(item.get("answer", "")), item.get("id")
  else:
    raise ValueError(f"{FIELD}: {where} must be a rljax.data.Prompt, a dict or a str, got "
                     f"{type(item).__name__}")
  pid = str(pid) if pid is not None else "py-" + hashlib.sha1(text.encode()).hexdigest()[:12]
  return Prompt(id=pid, text=text, answer=answer, difficulty=1)


class PythonTask:
  """The trainer's task interface over a user object (see the module docstring).

  Args:
    obj: the object the factory returned.
    source: the `task.python` spec, for messages.
    n_heldout: cap on the held-out prompts used.
  """

  name = "python"

  def __init__(self, obj, *, source: str, n_heldout: int = 256):
    for method in ("train_prompts", "heldout_prompts", "score"):
      if not callable(getattr(obj, method, None)):
        raise ValueError(f"{FIELD}={source!r}: the task object ({type(obj).__name__}) has no "
                         f"{method}() method; it needs train_prompts(), heldout_prompts(), "
                         "score(prompt, completion) and optionally demonstration(prompt)")
    self.obj, self.source = obj, source
    self._original = {}   # prompt id -> the user's own item, handed back to score/demonstration
    self._train = self._wrap(obj.train_prompts(), "train_prompts")
    self._heldout = self._wrap(obj.heldout_prompts(), "heldout_prompts")[:n_heldout]
    if not self._train or not self._heldout:
      raise ValueError(f"{FIELD}={source!r}: {len(self._train)} train and {len(self._heldout)} "
                       "held-out prompts; need at least one of each")
    self.difficulty_range = (1, 1)
    self.max_prompt_len = max(len(p.text) for p in self._train + self._heldout)
    self.max_completion_len = 0

  def _wrap(self, items, method):
    out = []
    for i, item in enumerate(items):
      prompt = _as_prompt(item, f"{method}()[{i}]")
      self._original[prompt.id] = item
      out.append(prompt)
    return out

  def train_prompts(self):
    return self._train

  def heldout_prompts(self):
    return self._heldout

  def demonstration(self, prompt, *, worked: bool = False) -> str:
    del worked
    if not callable(getattr(self.obj, "demonstration", None)):
      raise ValueError(f"{FIELD}={self.source!r}: the task object has no demonstration(prompt) "
                       "method, which SFT (sft.steps > 0) and ptx (algo.ptx_coef > 0) need; "
                       "add one or set sft.steps=0")
    return str(self.obj.demonstration(self._original.get(prompt.id, prompt)))

  def score(self, prompt, completion: str) -> RewardBreakdown:
    """The user's score as `total`; `accuracy` and `format` from its dict (else total / 0)."""
    out = self.obj.score(self._original.get(prompt.id, prompt), completion)
    if isinstance(out, Mapping):
      if "score" not in out:
        raise KeyError(f"{FIELD}: score() returned a dict without 'score': {sorted(out)}")
      total = float(out["score"])
      extras = {k: float(v) for k, v in out.items() if k != "score"
                and isinstance(v, int | float) and not isinstance(v, bool)}
    else:
      total, extras = float(out), {}
    if not math.isfinite(total):
      raise ValueError(f"{FIELD}: score() returned {total}")
    return RewardBreakdown(total=total, accuracy=extras.pop("accuracy", total),
                           format=extras.pop("format", 0.0), **extras)


def load_python_task(spec: str, *, n_heldout: int = 256) -> PythonTask:
  """Calls the factory `spec` names and wraps what it returns."""
  factory = load_object(spec, field=FIELD)
  if not callable(factory):
    raise ValueError(f"{FIELD}={spec!r} is a {type(factory).__name__}, not a factory")
  return PythonTask(factory(), source=spec, n_heldout=n_heldout)
