"""Table-driven answer-equivalence suite: positives and negatives, with units, percentages,
π and Chinese text around the number."""

import threading

import pytest

from rljax.answers import _math_client
from rljax.rewards.math import clean, extract_answer, is_equivalent, parse_numbers

# (prediction, ground truth): must match.
POSITIVE = [
  # 9 元 / 2 元 -> 4.5 张 (tickets): units and Chinese text around the number.
  ("9 元 / 2 元", "4.5"), ("4.5张", "4.5"), ("答：能买4.5张", "4.5"), ("\\text{4.5 元}", "4.5"),
  # 盈利__% (profit in percent), label 96.
  ("盈利96%", "96"), ("96%", "96"), ("96", "96%"), ("0.96", "96%"), ("96\\%", "96"),
  # label 3.14, outputs π / 圆周率 (pi) / 3.1415926.
  ("π", "3.14"), ("圆周率", "3.14"), ("3.1415926", "3.14"), ("\\pi", "3.1415926"),
  ("$\\pi$", "3.14"),
  # integers, decimals, fractions, scientific notation.
  ("42", "42"), ("42.0", "42"), ("4.50", "4.5"), ("-3", "−3"), ("１２", "12"),
  ("1/2", "0.5"), ("\\frac{1}{2}", "0.5"), ("\\dfrac{9}{2}", "4.5"), ("0.33", "1/3"),
  ("\\frac13", "0.33"), ("\\dfrac92", "4.5"), ("x = \\frac{9}{2}", "4.5"), ("-\\frac{1}{2}", "-0.5"),
  ("5\\%", "0.05"), ("90°", "90"), ("3 \\text{ cm}", "3"), ("12,345.6", "12345.6"), ("+5", "5"),
  ("\\dfrac{\\pi}{2}", "1.57"), ("6.02 \\times 10^{23}", "6.02e23"),
  ("1.5e3", "1500"), ("1.5\\times10^{3}", "1500"), ("1.5 × 10^3", "1500"), ("1,000", "1000"),
  ("\\$4.50", "4.5"),
  # extraction.
  ("The answer is $\\boxed{42}$.", "42"), ("<answer>1/2</answer>", "\\frac12"),
  ("so \\boxed{\\frac{1}{2}}", "\\boxed{0.5}"), ("\\boxed{\\{1,2\\}} then \\boxed{3}", "3"),
  # sets of solutions in any order.
  ("\\{2,1\\}", "\\{1,2\\}"), ("x=1 or x=2", "2, 1"), ("x = 2 或 x = 1", "{1,2}"), ("1, 2", "2, 1"),
  # symbolic (math-verify).
  ("\\frac{\\sqrt{3}}{2}", "\\frac{\\sqrt{12}}{4}"), ("\\sqrt{2}", "1.414"),
  ("(x+1)^2", "x^2+2x+1"),
]

# (prediction, ground truth): must NOT match.
NEGATIVE = [
  ("45", "4.5"), ("4.5", "45"), ("96", "9.6"), ("9.6", "96"), ("2", "1/2"), ("1/2", "2"),
  ("3.2", "π"), ("3", "\\pi"), ("3.15", "3.1415926"), ("4.55", "4.5"), ("50%", "0.5%"),
  ("\\{1,2\\}", "\\{1,2,3\\}"), ("{1,2,3}", "{1,2}"), ("1,2", "1.2"), ("9元2角", "92"),
  ("-4.5", "4.5"), ("x+1", "x+2"), ("(1,2)", "(2,1)"), ("", "0"), ("abc", "4"), ("4", ""),
  ("4.5", "4.6"), ("0", "0.5"),
]


@pytest.mark.parametrize("pred,gt", POSITIVE)
def test_equivalent(pred, gt):
  assert is_equivalent(pred, gt), (pred, gt, clean(extract_answer(pred)))


@pytest.mark.parametrize("pred,gt", NEGATIVE)
def test_not_equivalent(pred, gt):
  assert not is_equivalent(pred, gt), (pred, gt, clean(extract_answer(pred)))


@pytest.mark.parametrize("bad", [None, 3, b"4", ["4"], "\\boxed{", "}{", "1e999999999",
                                 "9" * 6000, "\\frac{1}{0}", "1/0", "<answer>", "\x00\ufffd"])
def test_never_raises(bad):
  assert is_equivalent(bad, "4") is False
  assert is_equivalent("4", bad) is False


def test_hard_deadline_kills_a_hung_verifier_and_recovers():
  before = dict(_math_client.STATS)
  assert not is_equivalent("2^{2^{40}}", "1", timeout=1.0)  # C-level bignum: only a kill stops it
  assert _math_client.STATS["timeouts"] == before["timeouts"] + 1
  assert is_equivalent("\\sqrt{4}", "2")  # a fresh worker serves the next call


def test_works_off_the_main_thread():
  out = []
  t = threading.Thread(target=lambda: out.append(is_equivalent("\\frac{\\sqrt{8}}{2}",
                                                               "\\sqrt{2}")))
  t.start()
  t.join(60)
  assert out == [True]


def test_extract_answer_and_parse_numbers():
  assert extract_answer("a <answer> 7 </answer> b \\boxed{8}") == "7"
  assert extract_answer("\\boxed{\\frac{1}{\\sqrt{2}}} x") == "\\frac{1}{\\sqrt{2}}"
  assert extract_answer("plain 5 ") == "plain 5"
  assert len(parse_numbers("1,000")) == 2  # 1000 or {1, 0}
  assert parse_numbers("9 2") == []
