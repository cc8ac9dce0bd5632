"""Math answer equivalence: `is_equivalent(prediction, ground_truth) -> bool`.

Accurate rewards are the one trick that always helps: a verifier must not give 0 to
"盈利96%" when the label is 96, nor to π / 圆周率 / 3.1415926 when it is 3.14
(`tests/test_rewards_math.py`).

Pipeline, for both strings:
1. `extract_answer`: content of the first `<answer>...</answer>` block, else of the last
   `\\boxed{...}` (`\\fbox`), else the whole text.
2. Cleaning: Unicode NFKC; `π`, `圆周率`, `pi` -> `\\pi`; `\\text{...}` unwrapped; the
   separators 或 / 和 / 、 / "or" / "and" -> `,`; remaining CJK text (units such as 元, 张)
   and a few unit words are dropped; `$`, `\\left`, `\\right`, thin spaces removed.
3. Fast path (pure Python, exact `Fraction` arithmetic): if both sides are numbers or comma
   lists of numbers (integers, decimals, `a/b`, `\\frac{a}{b}`, scientific notation
   `1.5e3` / `1.5\\times10^{3}`, percentages, thousands separators `1,000`), compare them
   with the rules below.
4. Otherwise math-verify (Hugging Face, sympy underneath) in a persistent worker process
   with a hard deadline; plus the constant rule when one side is a decimal.

Rules (documented, tested in tests/test_rewards_math.py):
- Exact numbers compare exactly: 4.5 == 9/2 == \\frac{9}{2} == 4.50; 4.5 != 45; 96 != 9.6.
- Percent: when exactly one side carries `%`, `X%` equals `X` and `X/100` (96% == 96 ==
  0.96); when both do, the numbers must match (50% != 0.5%).
- Rounded decimals: a written decimal with at least `min_decimals` (default 2) decimals
  matches a more precise value (a longer decimal or an exact fraction) that rounds or
  truncates to it at its number of decimals: 3.14 == 3.1415926, 0.33 == 1/3 == 0.333;
  4.5 != 4.55 (one decimal is not enough), 3.15 != 3.1415926.
- Constants: a decimal with >= `min_decimals` decimals matches an exact irrational constant
  (π, √2, e^1 ...) under the same rounding/truncation rule: 3.14 == π == 3.1415926;
  3.2 != π (one decimal is not enough).
- Lists/sets: order-free, every element matches one on the other side (x=1 or x=2 ==
  {2, 1}); {1,2} != {1,2,3}. Parenthesised tuples/intervals keep their order
  (math-verify).
- Any exception, timeout or unparsable input gives False; nothing is raised.
"""

from __future__ import annotations

import re
import unicodedata
from fractions import Fraction
from typing import NamedTuple

from rljax.answers._math_client import worker_call

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_CJK = re.compile(r"[\u2e80-\u9fff\uf900-\ufaff\u3000-\u303f\uff00-\uffef]+")
_UNITS = re.compile(r"(?<![A-Za-z\\])(?:cm|mm|km|kg|min|hours?|dollars?|yuan|degrees?|units?)"
                    r"(?![A-Za-z])|(?<=\d)\s+[mgsh](?![A-Za-z])")
_NUM = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)"
_SCI = rf"(?P<m>{_NUM})(?:[eE](?P<e1>[+-]?\d+)|(?:\*|×|\\times|\\cdot)10(?:\^|\*\*)\{{?(?P<e2>[+-]?\d+)\}}?)"
_FRAC = rf"(?P<s>[+-]?)\\[dt]?frac\{{(?P<fn>{_NUM})\}}\{{(?P<fd>{_NUM})\}}|(?P<n>{_NUM})/(?P<d>{_NUM})"
_VALUE = re.compile(rf"(?:{_SCI}|{_FRAC}|(?P<x>{_NUM}))(?P<pct>%|\\%)?")
_THOUSANDS = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_SPACED_DIGITS = re.compile(r"\d\s+[\d.]")
_MAX_EXPONENT = 400


class Value(NamedTuple):
  """An exact number, its count of written decimals (None: exact, e.g. 1/3), percent flag."""
  value: Fraction
  decimals: int | None
  pct: bool


def extract_answer(text: str) -> str:
  """The final answer in `text`: first `<answer>` block, else last `\\boxed{}`, else all.

  Args:
    text: a model completion or a ground-truth string.
  Returns:
    the stripped answer string ("" for non-string input).
  """
  if not isinstance(text, str):
    return ""
  m = _ANSWER.search(text)
  if m:
    text = m.group(1)
  boxes = list(_BOXED.finditer(text))
  if boxes:
    start, depth = boxes[-1].end(), 1
    for i in range(start, len(text)):
      depth += {"{": 1, "}": -1}.get(text[i], 0)
      if depth == 0:
        return text[start:i].strip()
  return text.strip()


def clean(s: str) -> str:
  """Normalises an extracted answer (constants, units, CJK text, separators, `$`)."""
  s = unicodedata.normalize("NFKC", s).replace("\u2212", "-")
  s = s.replace("圆周率", "\\pi ").replace("π", "\\pi ")
  s = re.sub(r"(?<![A-Za-z\\])pi(?![A-Za-z])", r"\\pi ", s)
  s = re.sub(r"\\([dt]?frac)\s*(\d)\s*(\d)", r"\\\1{\2}{\3}", s)  # \frac12 -> \frac{1}{2}
  s = re.sub(r"\\([dt]?frac)\s*(\{[^{}]*\})\s*(\d)", r"\\\1\2{\3}", s)
  s = re.sub(r"\\(?:text|mathrm|textbf|mbox|operatorname)\s*\{([^{}]*)\}", r" \1 ", s)
  s = re.sub(r"或者|或|和|以及|及|、|;|\s+or\s+|\s+and\s+", ",", s)
  s = _CJK.sub(" ", s)
  s = re.sub(r"\\\$|\\left|\\right|\\[,;!: ]|\$|\\\(|\\\)|\\\[|\\\]|~|\^\s*\{?\\circ\}?|°", " ", s)
  s = _UNITS.sub(" ", s)
  return " ".join(s.split()).strip(" .,:")


def _to_value(m: re.Match) -> Value:
  g = m.groupdict()
  if g["m"] is not None:
    exp = int(g["e1"] if g["e1"] is not None else g["e2"])
    if abs(exp) > _MAX_EXPONENT:  # left to math-verify, which runs under a deadline
      raise ValueError("exponent too large")
    v, dec = Fraction(g["m"]) * Fraction(10) ** exp, None
  elif g["fn"] is not None or g["n"] is not None:
    n, d = (g["fn"], g["fd"]) if g["fn"] is not None else (g["n"], g["d"])
    v, dec = Fraction(n) / Fraction(d), None
    v = -v if g["s"] == "-" else v
  else:
    x = g["x"]
    v, dec = Fraction(x), (len(x.split(".")[1]) if "." in x else 0)
  return Value(v, dec, g["pct"] is not None)


def parse_numbers(s: str) -> list[tuple[Value, ...]]:
  """Readings of `s` as a number or a comma list of numbers ([] if it is not one).

  Two readings when `s` is ambiguous: `1,000` is 1000 or the set {1, 0}. Digits separated
  only by a space (`9 2`, from `9元2角`) are not a number.
  """
  readings = []
  try:
    if _THOUSANDS.fullmatch(s.replace(" ", "")) and not _SPACED_DIGITS.search(s):
      readings.append((_to_value(_VALUE.fullmatch(s.replace(" ", "").replace(",", ""))),))
    body = s.replace("\\{", "{").replace("\\}", "}")
    if body.startswith("{") and body.endswith("}"):
      body = body[1:-1]
    items = [re.sub(r"^\s*[A-Za-z](?:_\{?\w+\}?)?\s*=", "", it) for it in body.split(",")]
    items = [it.rsplit("=", 1)[-1] for it in items]
    if any(_SPACED_DIGITS.search(it) for it in items):
      return readings
    ms = [_VALUE.fullmatch(it.replace(" ", "")) for it in items]
    if all(ms):
      readings.append(tuple(_to_value(m) for m in ms))
  except (ZeroDivisionError, ValueError, OverflowError):
    pass
  return readings


def _rounds_to(precise: Fraction, coarse: Fraction, decimals: int) -> bool:
  scale = 10 ** decimals
  scaled = precise * scale
  truncated = Fraction(int(scaled), scale)  # int() truncates toward zero
  rounded = Fraction(int(abs(scaled) + Fraction(1, 2)) * (1 if scaled >= 0 else -1), scale)
  return coarse in (truncated, rounded)


def _decimals_match(a: Value, b: Value, min_decimals: int) -> bool:
  if a.value == b.value:
    return True
  if a.decimals == b.decimals:
    return False
  # An exact value (fraction, scientific notation) counts as infinitely precise.
  coarse, precise = sorted((a, b), key=lambda v: float("inf") if v.decimals is None else v.decimals)
  if coarse.decimals is None:
    return False
  return coarse.decimals >= min_decimals and _rounds_to(precise.value, coarse.value,
                                                       coarse.decimals)


def _values_match(a: Value, b: Value, min_decimals: int) -> bool:
  if a.pct == b.pct:
    return _decimals_match(a, b, min_decimals)
  pct, plain = (a, b) if a.pct else (b, a)
  as_is = Value(pct.value, pct.decimals, False)
  scaled = Value(pct.value / 100, None if pct.decimals is None else pct.decimals + 2, False)
  return _decimals_match(as_is, plain, min_decimals) or \
      _decimals_match(scaled, plain, min_decimals)


def _lists_match(xs, ys, min_decimals: int) -> bool:
  xs, ys = list(dict.fromkeys(xs)), list(dict.fromkeys(ys))
  if len({v.value for v in xs}) != len({v.value for v in ys}):
    return False
  return all(any(_values_match(x, y, min_decimals) for y in ys) for x in xs) and \
      all(any(_values_match(x, y, min_decimals) for x in xs) for y in ys)


def _constant_match(dec: Value, other: str, min_decimals: int, timeout: float) -> bool:
  if dec.decimals is None or dec.decimals < min_decimals or dec.pct:
    return False
  v = worker_call({"op": "value", "s": other}, timeout=timeout)
  if not isinstance(v, float):
    return False
  precise = Fraction(v)
  return _rounds_to(precise, dec.value, dec.decimals)


def is_equivalent(prediction: str, ground_truth: str, *, min_decimals: int = 2,
                  timeout: float = 3.0) -> bool:
  """Whether a predicted final answer equals the ground truth (rules in the module doc).

  Args:
    prediction: model output (full completion or bare answer).
    ground_truth: label (bare answer, `\\boxed{}` or `<answer>` allowed).
    min_decimals: least number of decimals for approximate (rounded) matches.
    timeout: hard deadline in seconds for each math-verify call.
  Returns:
    True iff equivalent; False on any error, timeout or unparsable input.
  """
  try:
    p, g = clean(extract_answer(prediction)), clean(extract_answer(ground_truth))
    if not p or not g:
      return False
    if p == g:
      return True
    pr, gr = parse_numbers(p), parse_numbers(g)
    if pr and gr:
      return any(_lists_match(x, y, min_decimals) for x in pr for y in gr)
    if bool(pr) != bool(gr):
      num, other = (pr, g) if pr else (gr, p)
      single = [r[0] for r in num if len(r) == 1]
      if single and _constant_match(single[0], other, min_decimals, timeout):
        return True
    return worker_call({"op": "verify", "gold": g, "pred": p}, timeout=timeout) is True
  except Exception:  # noqa: BLE001  (a verifier never raises on model output)
    return False
