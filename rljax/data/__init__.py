"""Prompt sources (synthetic tasks, JSONL), tokenizers, batching, samplers, buffers."""

from rljax.data.batching import bucket_length, left_pad
from rljax.data.tasks import (
  RECOMMENDED_DIFFICULTY,
  TASKS,
  Prompt,
  RewardBreakdown,
  Task,
  make_task,
  parse_answer_tag,
)
from rljax.data.tokenizers import CharTokenizer, HFTokenizer, check_vocab

__all__ = [
  "RECOMMENDED_DIFFICULTY", "TASKS", "CharTokenizer", "HFTokenizer", "Prompt",
  "RewardBreakdown", "Task", "bucket_length", "check_vocab", "left_pad", "make_task",
  "parse_answer_tag",
]
