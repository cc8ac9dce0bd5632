"""Sampling controls: a frozen, validated `SamplingParams`."""

from __future__ import annotations

import dataclasses
import math
import numbers


@dataclasses.dataclass(frozen=True)
class SamplingParams:
  """How completions are drawn from the policy. Frozen and hashable.

  The distribution sampled from at every step is, in this order (the order of
  `transformers` `generate`): logits / temperature -> top-k -> top-p (on the top-k
  renormalised distribution) -> min-p -> renormalise. `greedy=True` takes the argmax instead.

  Attributes:
    max_new_tokens: T, number of completion slots (generation stops earlier only when every
      row has emitted a stop token).
    temperature: logits are divided by it; > 0. With `greedy=True` it only scales
      `Rollout.logp_full`, and 0 is allowed (then `logp_full` uses the raw logits).
    top_k: keep the k most likely tokens; 0 disables.
    top_p: nucleus sampling (Holtzman et al. 2019, "The Curious Case of Neural Text
      Degeneration", arXiv:1904.09751): keep the smallest set of most likely tokens whose
      mass is >= top_p; 1.0 disables. Must be in (0, 1].
    min_p: min-p sampling (Nguyen et al. 2024, "Turning Up the Heat: Min-p Sampling for
      Creative and Coherent LLM Outputs", arXiv:2407.01082): keep tokens with
      p >= min_p * p_max; 0.0 disables. Must be in [0, 1].
    greedy: argmax decoding (the sampled-from distribution is a point mass, so `logp` is 0).
    n: completions per prompt (G); rows are grouped prompt-major, `group_id` = prompt index.
    stop_tokens: token ids that end a completion (the stop token itself is kept and masked
      in); () never stops early.
  """

  max_new_tokens: int
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  min_p: float = 0.0
  greedy: bool = False
  n: int = 1
  stop_tokens: tuple[int, ...] = ()

  def __post_init__(self):
    _check_int("max_new_tokens", self.max_new_tokens, minimum=1)
    _check_int("top_k", self.top_k, minimum=0)
    _check_int("n", self.n, minimum=1)
    if not isinstance(self.greedy, bool):
      raise TypeError(f"SamplingParams.greedy must be a bool, got {self.greedy!r}")
    temperature = _check_float("temperature", self.temperature)
    if temperature < 0 or (temperature == 0 and not self.greedy):
      raise ValueError(
          f"SamplingParams.temperature must be > 0 (0 only with greedy=True), got {temperature}")
    top_p = _check_float("top_p", self.top_p)
    if not 0.0 < top_p <= 1.0:
      raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {top_p}")
    min_p = _check_float("min_p", self.min_p)
    if not 0.0 <= min_p <= 1.0:
      raise ValueError(f"SamplingParams.min_p must be in [0, 1], got {min_p}")
    stop = self.stop_tokens
    items = [stop] if _is_int(stop) else _iter_or_none(stop)
    if isinstance(stop, str | bytes) or not all(_is_int(s) for s in items):
      raise TypeError(f"SamplingParams.stop_tokens must be a sequence of ints, got {stop!r}")
    stop = tuple(int(s) for s in items)
    if any(s < 0 for s in stop):
      raise ValueError(f"SamplingParams.stop_tokens must be non-negative ids, got {stop}")
    for name, value in (("temperature", temperature), ("top_p", top_p), ("min_p", min_p),
                        ("stop_tokens", tuple(dict.fromkeys(stop)))):
      object.__setattr__(self, name, value)

  def replace(self, **changes) -> SamplingParams:
    """Returns a validated copy with `changes` applied."""
    return dataclasses.replace(self, **changes)


def _is_int(x) -> bool:
  return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _iter_or_none(x):
  try:
    return list(x)
  except TypeError:
    return [None]


def _check_int(name: str, value, *, minimum: int) -> None:
  if not _is_int(value):
    raise TypeError(f"SamplingParams.{name} must be an int, got {value!r}")
  if value < minimum:
    raise ValueError(f"SamplingParams.{name} must be >= {minimum}, got {value}")


def _check_float(name: str, value) -> float:
  if isinstance(value, bool) or not isinstance(value, numbers.Real):
    raise TypeError(f"SamplingParams.{name} must be a real number, got {value!r}")
  value = float(value)
  if not math.isfinite(value):
    raise ValueError(f"SamplingParams.{name} must be finite, got {value}")
  return value
