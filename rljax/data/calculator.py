"""The calculator task: multi-digit sums a tiny model cannot do in its head, and a tool.

Prompt `C:347+589\\n`, answer `0936` (sums are written zero-padded to a fixed width). With the calculator environment
(`rljax.envs.calculator`, `experiments/calculator.py`) the model may call
`<call>347+589</call>`; the environment answers `<result>936</result>` and the model then
writes `<answer>936</answer>`. The tool demonstration is
`<call>347+589</call><result>936</result><answer>936</answer>`, whose `<result>` span is the
environment's and carries no SFT loss (`OBSERVATION_RE`); a `tool_fraction` of the prompts
(fixed per prompt, a hash of its text) show it, the rest answer directly
(`<answer>936</answer>`), so greedy decoding after SFT guesses and sampling sometimes
calls the tool: the "rare reliable mode" RL can promote (as the arithmetic task's rare
scratchpad).
"""

from __future__ import annotations

import hashlib
import re

OBSERVATION_RE = re.compile(r"<result>.*?</result>", re.DOTALL)
TAGS = ("<call>", "</call>", "<result>", "</result>")
_TERMS = re.compile(r"\d+|[+\-]")


def evaluate(expr: str) -> int:
  """Value of a chain `a op b op ...` of non-negative integers with + and -.

  Raises:
    ValueError: anything else (the environment reports it as a failed call).
  """
  expr = expr.strip()
  if not re.fullmatch(r"\d+([+\-]\d+)*", expr) or len(expr) > 64:
    raise ValueError(f"not a +/- chain of integers: {expr!r}")
  toks = _TERMS.findall(expr)
  acc = int(toks[0])
  for op, x in zip(toks[1::2], toks[2::2]):
    acc = acc + int(x) if op == "+" else acc - int(x)
  return acc


def shows_tool(prompt_text: str, fraction: float) -> bool:
  """Whether the demonstration of this prompt calls the tool (fixed per prompt)."""
  if fraction >= 1.0:
    return True
  h = int.from_bytes(hashlib.sha256(f"tool/{prompt_text}".encode()).digest()[:8], "big")
  return (h % 1000) < round(fraction * 1000)


def value_text(value: int, width: int) -> str:
  """A sum written with `width` digits, zero-padded (the calculator's and the answers'
  format: a copy from `<result>` into `<answer>` is then a fixed-distance copy)."""
  return str(value).zfill(width)


def result_width(d, digits) -> int:
  return len(str((d + 1) * (10 ** digits - 1)))


def generate(rng, d, *, digits=3, tool_fraction=0.2):
  del tool_fraction
  terms = [rng.randint(10 ** (digits - 1), 10 ** digits - 1) for _ in range(d + 1)]
  text = "+".join(str(t) for t in terms)
  return f"C:{text}\n", value_text(evaluate(text), result_width(d, digits))


def demonstration(prompt, *, tool_fraction=0.2, **_):
  answer = f"<answer>{prompt.answer}</answer>"
  if not shows_tool(prompt.text, tool_fraction):
    return answer
  expr = prompt.text[2:].strip()
  return f"<call>{expr}</call><result>{prompt.answer}</result>{answer}"


def check(prompt, content):
  return re.fullmatch(r"-?\d+", content) is not None and int(content) == int(prompt.answer)


def prompt_len(d, *, digits=3, **_):
  return 2 + (d + 1) * digits + d + 1


def completion_len(d, *, digits=3, **_):
  value = (d + 1) * digits + 1   # a generous bound on the answer's characters
  expr = (d + 1) * digits + d
  return 2 + expr + 2 + value + 2 + value   # call, result, answer (tags are one token each)
