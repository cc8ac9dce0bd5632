"""Generative reward: a judge (any callable, e.g. a larger model behind HTTP) scores a completion.

LLM-as-a-judge (Zheng et al. 2023, "Judging LLM-as-a-Judge with MT-Bench and Chatbot
Arena", arXiv:2306.05685): the judge reads the question, the completion and optionally a
reference answer, and returns a score (a number, or text from which `parse` reads one).

Failures (exception, timeout, unparseable or out-of-range output) are retried `retries`
times, then raised as `JudgeError` with a message naming what went wrong, so that
`rljax.rewards.compose` contains and reports them.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import math
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

DEFAULT_TEMPLATE = (
    "Rate the answer to the question from 0 to 10. Reply with 'Score: <number>'.\n"
    "Question:\n{prompt}\nReference answer:\n{reference}\nAnswer:\n{completion}\n")

_SCORE_PATTERNS = (
    re.compile(r"<score>\s*([-+]?\d+(?:\.\d+)?)\s*</score>", re.IGNORECASE),
    re.compile(r"score\s*[:=]\s*([-+]?\d+(?:\.\d+)?)", re.IGNORECASE),
)


class JudgeError(RuntimeError):
  """A judge failed (after retries); the message says how (timeout, HTTP, unparseable)."""


def parse_score(output: Any) -> float:
  """A finite score from a judge's output.

  Accepts a number; a string that is a number; or text containing `<score>x</score>` or
  `Score: x` (the last occurrence wins, so reasoning before the verdict is ignored).

  Raises:
    ValueError: naming the (shortened) output when no finite score is found.
  """
  if isinstance(output, bool):
    raise ValueError(f"judge returned a bool ({output}), not a score")
  if isinstance(output, int | float):
    value = float(output)
  elif isinstance(output, str):
    value = _score_from_text(output)
  else:
    raise ValueError(f"judge returned {type(output).__name__}, not a number or text")
  if not math.isfinite(value):
    raise ValueError(f"judge returned a non-finite score {value}")
  return value


def _score_from_text(text: str) -> float:
  try:
    return float(text.strip())
  except ValueError:
    pass
  for pattern in _SCORE_PATTERNS:
    found = pattern.findall(text)
    if found:
      return float(found[-1])
  raise ValueError(f"no score found in judge output {text[:200]!r}")


class JudgeReward:
  """A judge as a reward function `fn(prompt, completion) -> float` (for `compose`).

  Args:
    judge_fn: callable (prompt_text, completion, reference) -> float or str; reference is
      `prompt.answer` (None when the prompt has none).
    parse: judge output -> float (default `parse_score`); raise ValueError on garbage.
    timeout: seconds per judge call (None: no deadline). A call that overruns is abandoned
      on its worker thread (a Python thread cannot be killed) and counts as a failure.
    retries: extra attempts after a failure (exception, timeout, parse error, out of range).
    bounds: optional (lo, hi); a score outside is a failure.
    backoff: seconds slept before retry i (times i).
  Raises (from `__call__`):
    JudgeError: after 1 + retries failed attempts; the message gives each attempt's failure.
  """

  def __init__(self, judge_fn: Callable[[str, str, str | None], Any], *,
               parse: Callable[[Any], float] = parse_score, timeout: float | None = 30.0,
               retries: int = 0, bounds: tuple[float, float] | None = None,
               backoff: float = 0.0):
    if retries < 0:
      raise ValueError(f"JudgeReward: retries must be >= 0, got {retries}")
    self.judge_fn, self.parse, self.timeout = judge_fn, parse, timeout
    self.retries, self.bounds, self.backoff = int(retries), bounds, float(backoff)
    self._pool = None
    self.calls = self.failures = 0

  def _call(self, *args):
    if self.timeout is None:
      return self.judge_fn(*args)
    if self._pool is None:
      self._pool = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="judge")
    future = self._pool.submit(self.judge_fn, *args)
    try:
      return future.result(timeout=self.timeout)
    except cf.TimeoutError:
      self._pool.shutdown(wait=False)  # abandon the stuck call; the next one gets a new thread
      self._pool = None
      raise TimeoutError(f"judge timed out after {self.timeout} s") from None

  def _attempt(self, args) -> float:
    score = self.parse(self._call(*args))
    if self.bounds is not None and not self.bounds[0] <= score <= self.bounds[1]:
      raise ValueError(f"judge score {score} outside bounds {self.bounds}")
    return float(score)

  def __call__(self, prompt: Any, completion: str) -> float:
    args = (getattr(prompt, "text", prompt), completion, getattr(prompt, "answer", None))
    errors = []
    for attempt in range(1 + self.retries):
      if attempt and self.backoff:
        time.sleep(self.backoff * attempt)
      self.calls += 1
      try:
        return self._attempt(args)
      except Exception as e:  # noqa: BLE001  (collected, then raised as one JudgeError)
        self.failures += 1
        errors.append(f"{type(e).__name__}: {e}")
    pid = getattr(prompt, "id", None)
    where = f" on prompt {pid!r}" if pid is not None else ""
    raise JudgeError(f"judge failed{where} after {len(errors)} attempt(s): " + " | ".join(errors))


def http_judge(url: str, *, template: str = DEFAULT_TEMPLATE, timeout: float = 30.0,
               response_key: str = "score",
               headers: Mapping[str, str] | None = None) -> Callable[[str, str, str | None], Any]:
  """A judge_fn that POSTs JSON to `url` (standard library only) and returns its verdict.

  Request body: {"prompt": template.format(prompt=, completion=, reference=),
  "question": prompt_text, "completion": ..., "reference": ...}.
  Response: a JSON object whose `response_key` holds a number or text (returned as is,
  for `JudgeReward`'s `parse`); a non-JSON body is returned as text.

  Args:
    url: http(s) endpoint.
    template: `str.format` template with {prompt}, {completion}, {reference}.
    timeout: socket timeout in seconds.
    response_key: field of the JSON response that holds the verdict.
    headers: extra HTTP headers (e.g. authorization).
  Raises (from the returned callable):
    JudgeError: HTTP status >= 400, connection failure or timeout, or a JSON response
      without `response_key`; the message names the url.
  Note: the environment's proxy settings apply (set no_proxy for local endpoints).
  """
  def judge(prompt_text: str, completion: str, reference: str | None) -> Any:
    rendered = template.format(prompt=prompt_text, completion=completion,
                               reference="" if reference is None else reference)
    body = json.dumps({"prompt": rendered, "question": prompt_text, "completion": completion,
                       "reference": reference}).encode()
    request = urllib.request.Request(
        url, data=body, method="POST",
        headers={"Content-Type": "application/json", **dict(headers or {})})
    try:
      with urllib.request.urlopen(request, timeout=timeout) as response:
        raw = response.read().decode("utf-8", errors="replace")
    except urllib.error.HTTPError as e:
      detail = e.read().decode("utf-8", errors="replace")[:200]
      raise JudgeError(f"judge at {url} answered HTTP {e.code}: {detail!r}") from None
    except (urllib.error.URLError, TimeoutError, OSError) as e:
      reason = getattr(e, "reason", e)
      raise JudgeError(f"judge at {url} unreachable or timed out ({timeout} s): {reason}") from None
    try:
      payload = json.loads(raw)
    except json.JSONDecodeError:
      return raw
    if not isinstance(payload, dict):
      return payload
    if response_key not in payload:
      raise JudgeError(f"judge at {url}: response has no {response_key!r} field: {raw[:200]!r}")
    return payload[response_key]

  return judge
