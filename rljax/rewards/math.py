"""Math answer equivalence, `is_equivalent(prediction, ground_truth) -> bool`: the stable
import path of `rljax.answers.math` (its docstring has the pipeline and the rules)."""

from rljax.answers.math import Value, clean, extract_answer, is_equivalent, parse_numbers

__all__ = ["Value", "clean", "extract_answer", "is_equivalent", "parse_numbers"]
