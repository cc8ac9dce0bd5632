"""Rule-based reward functions with the `fn(prompt, completion) -> float` protocol."""

from __future__ import annotations

from collections.abc import Callable

from rljax.answers import is_equivalent, parse_answer_tag


def format_reward(prompt, completion: str) -> float:
  """1.0 iff the completion ends with exactly one well-formed `<answer>...</answer>` block.

  The format reward of DeepSeek-R1 (arXiv:2501.12948, Sec. 2.2.2).
  """
  return float(parse_answer_tag(completion)[1])


def math_accuracy_reward(prompt, completion: str) -> float:
  """1.0 iff the completion's final answer is equivalent to `prompt.answer` (`is_equivalent`)."""
  return float(is_equivalent(completion, prompt.answer))


def task_accuracy_reward(task) -> Callable:
  """The accuracy component of a synthetic task's verifier (`Task.score`)."""
  return lambda prompt, completion: task.score(prompt, completion)["accuracy"]


def soft_overlong_reward(*, max_len: int, cache_len: int,
                         length_fn: Callable[[str], int] = len) -> Callable:
  """DAPO soft overlong punishment as a reward function (Yu et al. 2025, arXiv:2503.14476, Eq. 13).

  R_length(y) = 0 if |y| <= L_max - L_cache; (L_max - L_cache - |y|) / L_cache if
  L_max - L_cache < |y| <= L_max; -1 if |y| > L_max.

  Args:
    max_len: L_max, in the units of `length_fn`.
    cache_len: L_cache, the width of the linear ramp (0 < cache_len <= max_len).
    length_fn: completion text -> length; default characters (pass
      `lambda s: len(tokenizer.encode(s))` for tokens).
  Returns:
    fn(prompt, completion) -> penalty in [-1, 0].
  Note: on arrays of token lengths use `rljax.ops.shaping.soft_overlong_penalty`; this
  hook is for scoring text (e.g. with `compose`).
  """
  if not 0 < cache_len <= max_len:
    raise ValueError(f"need 0 < cache_len <= max_len, got cache_len={cache_len}, "
                     f"max_len={max_len}")

  def reward(prompt, completion: str) -> float:
    n = length_fn(completion)
    if n <= max_len - cache_len:
      return 0.0
    if n > max_len:
      return -1.0
    return (max_len - cache_len - n) / cache_len

  return reward
