"""Prompt sources: JSONL files and any iterable of dict rows (Hugging Face `datasets`,
TFDS data sources), with errors that say where (file:line or row index, field)."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable

from rljax.data.tasks import Prompt


def _as_text(value):
  return value.decode("utf-8") if isinstance(value, bytes) else value


def row_to_prompt(row, where: str, *, text_field: str = "prompt", answer_field: str = "answer",
                  id_field: str | None = None, difficulty_field: str | None = None,
                  template: Callable[[str], str] | None = None) -> Prompt:
  """One dict row -> `Prompt`; `where` (e.g. "file.jsonl:3") prefixes every error."""
  if not isinstance(row, dict):
    raise ValueError(f"{where}: expected a JSON object / dict, got {type(row).__name__}")
  needed = [text_field, answer_field] + [k for k in (id_field, difficulty_field) if k]
  missing = [k for k in needed if k not in row]
  if missing:
    raise ValueError(f"{where}: missing field(s) {missing}; the row has {sorted(row)}")
  text = _as_text(row[text_field])
  if not isinstance(text, str) or not text:
    raise ValueError(f"{where}: field {text_field!r} must be a non-empty string")
  if template is not None:
    text = template(text)
  difficulty = 1
  if difficulty_field:
    try:
      difficulty = int(row[difficulty_field])
    except (TypeError, ValueError) as e:
      raise ValueError(f"{where}: field {difficulty_field!r} is not an int: "
                       f"{row[difficulty_field]!r}") from e
  pid = (str(_as_text(row[id_field])) if id_field else
         f"{where}-{hashlib.sha1(text.encode()).hexdigest()[:8]}")
  return Prompt(id=pid, text=text, answer=str(_as_text(row[answer_field])),
                difficulty=difficulty)


def prompts_from_records(rows: Iterable[dict], *, source: str = "records",
                         **fields) -> list[Prompt]:
  """Prompts from dict rows, e.g. a `datasets.Dataset` or `tfds.as_numpy(ds)` (bytes decoded).

  Args:
    rows: iterable of dicts.
    source: name used in ids and errors (`"<source>:<row index>"`).
    **fields: `text_field`, `answer_field`, `id_field`, `difficulty_field`, `template`
      (see `load_jsonl_prompts`).
  Raises:
    ValueError: no rows, or a bad row (its index and the field are named).
  """
  prompts = [row_to_prompt(r, f"{source}:{i}", **fields) for i, r in enumerate(rows)]
  if not prompts:
    raise ValueError(f"{source}: no rows")
  return prompts


def read_jsonl_rows(path: str) -> tuple[list[dict], list[str]]:
  """The rows of a JSONL file (blank lines skipped) and their locations `"<file name>:<line>"`.

  Raises:
    FileNotFoundError; ValueError (malformed JSON, with the line and column; empty file).
  """
  if not os.path.isfile(path):
    raise FileNotFoundError(f"JSONL prompt file {path!r} does not exist")
  rows, where, name = [], [], os.path.basename(path)
  with open(path, encoding="utf-8") as f:
    for lineno, line in enumerate(f, start=1):
      if not line.strip():
        continue
      try:
        rows.append(json.loads(line))
      except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{lineno}: malformed JSON ({e.msg} at column {e.colno})") from e
      where.append(f"{name}:{lineno}")
  if not rows:
    raise ValueError(f"JSONL prompt file {path!r} is empty")
  return rows, where


def load_jsonl_prompts(path: str, **fields) -> list[Prompt]:
  """Reads prompts from a JSONL file (blank lines are skipped).

  Args:
    path: the file.
    **fields:
      text_field, answer_field: keys of the prompt text (default "prompt") and the
        ground-truth answer (default "answer"; a non-string such as 96 becomes "96").
      id_field: key of the prompt id; default `"<file name>:<line>-<hash of text>"`.
      difficulty_field: key of an int difficulty; default 1 for every prompt.
      template: optional text -> prompt string (e.g. `HFTokenizer.apply_chat_template`
        wrapped as `lambda t: tok.apply_chat_template([{"role": "user", "content": t}])`).
  Returns:
    list of `Prompt`.
  Raises:
    FileNotFoundError, ValueError (empty file; malformed JSON or a missing/invalid field,
    with the line number and the field name).
  """
  rows, where = read_jsonl_rows(path)
  return [row_to_prompt(row, loc, **fields) for row, loc in zip(rows, where)]
