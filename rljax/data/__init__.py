"""Prompt sources (synthetic tasks, JSONL), tokenizers, batching, samplers, buffers."""

from rljax.data.audit import AuditRow, audit, audit_prompt, format_report
from rljax.data.batching import bucket_length, left_pad
from rljax.data.buffer import (
  DynamicSamplingBuffer,
  DynamicSamplingError,
  filter_groups_bg,
  group_keep_mask,
)
from rljax.data.jsonl import load_jsonl_prompts, prompts_from_records, row_to_prompt
from rljax.data.rejection import best_of_k, rejection_sft_pairs
from rljax.data.samplers import (
  SAMPLERS,
  CurriculumSampler,
  PrioritizedSampler,
  UniformSampler,
  curriculum_level_probs,
  make_sampler,
)
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
  "AuditRow", "audit", "audit_prompt", "format_report",
  "SAMPLERS", "CurriculumSampler", "DynamicSamplingBuffer", "DynamicSamplingError",
  "PrioritizedSampler", "UniformSampler", "curriculum_level_probs", "filter_groups_bg",
  "group_keep_mask", "load_jsonl_prompts", "make_sampler", "prompts_from_records",
  "row_to_prompt", "best_of_k", "rejection_sft_pairs",
  "RECOMMENDED_DIFFICULTY", "TASKS", "CharTokenizer", "HFTokenizer", "Prompt",
  "RewardBreakdown", "Task", "bucket_length", "check_vocab", "left_pad", "make_task",
  "parse_answer_tag",
]
