"""Verifiers (math answer equivalence, format, task accuracy), composition, shaping hooks."""

from rljax.rewards.base import (
  FAILURE_MODES,
  ComposedRewards,
  Composite,
  RewardError,
  RewardFailure,
  RewardFn,
  compose,
)
from rljax.rewards.judge import JudgeReward, http_judge
from rljax.rewards.math import extract_answer, is_equivalent
from rljax.rewards.reward_model import RewardModelScorer, load_reward_model, save_reward_model
from rljax.rewards.rules import (
  format_reward,
  math_accuracy_reward,
  soft_overlong_reward,
  task_accuracy_reward,
)

__all__ = [
  "FAILURE_MODES", "ComposedRewards", "Composite", "RewardError", "RewardFailure", "RewardFn",
  "compose", "extract_answer", "format_reward", "is_equivalent", "math_accuracy_reward",
  "soft_overlong_reward", "task_accuracy_reward", "JudgeReward", "http_judge",
  "RewardModelScorer", "load_reward_model", "save_reward_model",
]
