"""The `<answer>...</answer>` convention of the tasks: the block and whether it is well formed."""

from __future__ import annotations

import re

ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def parse_answer_tag(completion: str) -> tuple[str | None, bool]:
  """Returns (content of the first `<answer>` block or None, well_formed).

  well_formed: exactly one `<answer>...</answer>` block, nothing but whitespace after it.
  """
  blocks = list(ANSWER_RE.finditer(completion))
  if not blocks:
    return None, False
  first = blocks[0]
  ok = len(blocks) == 1 and completion[first.end():].strip() == "" and \
      "<answer>" not in first.group(1)
  return first.group(1).strip(), ok
