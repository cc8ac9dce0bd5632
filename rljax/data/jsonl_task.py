"""A task over your own JSONL prompts: `{"prompt": ..., "answer": ..., "solution": ...}` rows.

A thin constructor of `rljax.data.records_task.RecordsTask` (scoring, format reward,
hash-bucket held-out split and demonstrations are documented there); errors name the
file and line.
"""

from __future__ import annotations

from rljax.data.jsonl import read_jsonl_rows
from rljax.data.records_task import RecordsTask


class JsonlTask(RecordsTask):
  """`RecordsTask` over the rows of one JSONL file.

  Args:
    path: the JSONL file.
    **options: `RecordsTask` keyword arguments (field names, answer extractor, held-out
      fraction and size, format weight, prompt template).
  """

  name = "jsonl"

  def __init__(self, path: str, **options):
    self.path = path
    rows, where = read_jsonl_rows(path)
    super().__init__(rows, source=path, where=where, **options)
