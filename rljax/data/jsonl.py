"""JSONL prompt source: one JSON object per line -> `Prompt`s, with errors that say where."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable

from rljax.data.tasks import Prompt


def load_jsonl_prompts(path: str, *, text_field: str = "prompt", answer_field: str = "answer",
                       id_field: str | None = None, difficulty_field: str | None = None,
                       template: Callable[[str], str] | None = None) -> list[Prompt]:
  """Reads prompts from a JSONL file (blank lines are skipped).

  Args:
    path: the file.
    text_field, answer_field: keys of the prompt text and the ground-truth answer (a
      non-string answer such as 96 is converted with `str`).
    id_field: key of the prompt id; default: `"<file name>:<line>-<hash of text>"`.
    difficulty_field: key of an int difficulty; default 1 for every prompt.
    template: optional text -> prompt string (e.g. a chat template of `HFTokenizer`).
  Returns:
    list of `Prompt`.
  Raises:
    FileNotFoundError, ValueError (empty file; malformed JSON or a missing/invalid field,
    with the line number and the field name).
  """
  if not os.path.isfile(path):
    raise FileNotFoundError(f"JSONL prompt file {path!r} does not exist")
  prompts, name = [], os.path.basename(path)
  with open(path, encoding="utf-8") as f:
    for lineno, line in enumerate(f, start=1):
      if not line.strip():
        continue
      try:
        row = json.loads(line)
      except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{lineno}: malformed JSON ({e.msg} at column {e.colno})") from e
      if not isinstance(row, dict):
        raise ValueError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
      needed = [text_field, answer_field] + [k for k in (id_field, difficulty_field) if k]
      missing = [k for k in needed if k not in row]
      if missing:
        raise ValueError(f"{path}:{lineno}: missing field(s) {missing}; the line has "
                         f"{sorted(row)}")
      text = row[text_field]
      if not isinstance(text, str) or not text:
        raise ValueError(f"{path}:{lineno}: field {text_field!r} must be a non-empty string")
      if template is not None:
        text = template(text)
      difficulty = 1
      if difficulty_field:
        try:
          difficulty = int(row[difficulty_field])
        except (TypeError, ValueError) as e:
          raise ValueError(f"{path}:{lineno}: field {difficulty_field!r} is not an int: "
                           f"{row[difficulty_field]!r}") from e
      pid = (str(row[id_field]) if id_field else
             f"{name}:{lineno}-{hashlib.sha1(text.encode()).hexdigest()[:8]}")
      prompts.append(Prompt(id=pid, text=text, answer=str(row[answer_field]),
                            difficulty=difficulty))
  if not prompts:
    raise ValueError(f"JSONL prompt file {path!r} is empty")
  return prompts
