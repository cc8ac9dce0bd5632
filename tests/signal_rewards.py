"""Reward functions for trainer tests: an untrained micro model never solves the task, so
its verifier reward is 0 everywhere and every gradient is 0. These vary with the text."""


def digit_share(prompt, completion, answer):
  """Share of digits in the completion."""
  return sum(ch.isdigit() for ch in completion) / max(len(completion), 1)
