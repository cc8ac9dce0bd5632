"""Answers: the `<answer>` block of a completion, and whether two answers are the same.

Below both `rljax.data` (tasks score completions with it) and `rljax.rewards` (verifiers
and rules are built on it). `rljax.rewards.math` re-exports the equivalence check, its
stable import path.
"""

from rljax.answers.math import clean, extract_answer, is_equivalent, parse_numbers
from rljax.answers.tags import ANSWER_RE, parse_answer_tag

__all__ = ["ANSWER_RE", "clean", "extract_answer", "is_equivalent", "parse_answer_tag",
           "parse_numbers"]
