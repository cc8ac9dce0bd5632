"""Countdown: reach a target from given numbers with + - * and parentheses.

Each given number must be used exactly once (the TinyZero rule); any expression that
does so and evaluates to the target is correct, so the task has many correct answers and
rewards search. Prompt `N:3 5 7 T:56\\n` (numbers sorted, so a permutation of a problem
is the same problem for the held-out split); demonstration
`5+3=8\\n8*7=56\\n<answer>(5+3)*7</answer>`.

Generation draws a left fold `((a op b) op c) ...` whose intermediate values all lie in
[0, max_target]; the demonstration is the first such fold in a fixed search order, so
SFT targets are deterministic.
"""

from __future__ import annotations

import ast
import itertools
import re

_PROMPT_RE = re.compile(r"N:([\d ]+) T:(\d+)")
_EXPR_CHARS = re.compile(r"[\d+\-*() ]+")
_MAX_EXPR_CHARS = 64
_OPS = "+-*"


def _apply(acc: int, op: str, x: int) -> int:
  return acc + x if op == "+" else acc - x if op == "-" else acc * x


def _fold(nums, ops, max_target):
  """Values of a left fold, or None if any intermediate leaves [0, max_target]."""
  acc, vals = nums[0], []
  for op, x in zip(ops, nums[1:]):
    acc = _apply(acc, op, x)
    if not 0 <= acc <= max_target:
      return None
    vals.append(acc)
  return vals


def generate(rng, d, *, max_number=9, max_target=99):
  """Random problem with d + 1 numbers in [1, max_number]; returns (prompt, target)."""
  for _ in range(1000):
    nums = [rng.randint(1, max_number) for _ in range(d + 1)]
    ops = [rng.choice(_OPS) for _ in range(d)]
    vals = _fold(nums, ops, max_target)
    if vals and vals[-1] >= 1:
      target = vals[-1]
      return f"N:{' '.join(map(str, sorted(nums)))} T:{target}\n", str(target)
  raise RuntimeError(f"countdown: no problem found for d={d}, max_target={max_target}")


def parse_prompt(text: str) -> tuple[list[int], int]:
  m = _PROMPT_RE.match(text)
  if m is None:
    raise ValueError(f"countdown: malformed prompt {text!r}")
  return [int(x) for x in m.group(1).split()], int(m.group(2))


def fold_expression(nums, ops) -> str:
  """Infix string of a left fold with the parentheses it needs."""
  expr, additive_top = str(nums[0]), False
  for op, x in zip(ops, nums[1:]):
    if op == "*" and additive_top:
      expr = f"({expr})"
    expr = f"{expr}{op}{x}"
    additive_top = op != "*"
  return expr


def solve(nums, target, *, max_target=99):
  """First left-fold solution in a fixed order -> (ordered nums, ops), or None."""
  for perm in sorted(set(itertools.permutations(nums))):
    for ops in itertools.product(_OPS, repeat=len(nums) - 1):
      vals = _fold(perm, ops, max_target)
      if vals and vals[-1] == target:
        return list(perm), list(ops)
  return None


def demonstration(prompt, *, max_number=9, max_target=99):
  nums, target = parse_prompt(prompt.text)
  sol = solve(nums, target, max_target=max_target)
  if sol is None:
    raise ValueError(f"countdown: no left-fold solution for {prompt.text!r}")
  perm, ops = sol
  lines, acc = [], perm[0]
  for op, x in zip(ops, perm[1:]):
    new = _apply(acc, op, x)
    lines.append(f"{acc}{op}{x}={new}")
    acc = new
  return "\n".join(lines) + f"\n<answer>{fold_expression(perm, ops)}</answer>"


def _eval(node) -> tuple[int, list[int]]:
  """Evaluates an ast of + - * over non-negative int literals -> (value, literals)."""
  if isinstance(node, ast.Constant) and type(node.value) is int:
    return node.value, [node.value]
  if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult)):
    a, la = _eval(node.left)
    b, lb = _eval(node.right)
    op = "+" if isinstance(node.op, ast.Add) else "-" if isinstance(node.op, ast.Sub) else "*"
    return _apply(a, op, b), la + lb
  raise ValueError("disallowed syntax")


def check(prompt, content: str) -> bool:
  """True iff `content` uses exactly the prompt's numbers (as a multiset) and hits the target."""
  nums, target = parse_prompt(prompt.text)
  content = content.strip()
  if len(content) > _MAX_EXPR_CHARS or not _EXPR_CHARS.fullmatch(content):
    return False
  try:
    value, literals = _eval(ast.parse(content, mode="eval").body)
  except (SyntaxError, ValueError, RecursionError):
    return False
  return sorted(literals) == sorted(nums) and value == target


def prompt_len(d, *, max_number=9, max_target=99):
  return 2 + (d + 1) * len(str(max_number)) + d + 3 + len(str(max_target)) + 1


def completion_len(d, *, max_number=9, max_target=99):
  v, n = len(str(max_target)), len(str(max_number))
  steps = d * (v + 1 + n + 1 + v + 1)  # "acc op x=new\n"
  expr = (d + 1) * n + d + 2 * d  # numbers, operators, at most one pair of parens per op
  return steps + 2 + expr  # "<answer>" and "</answer>" are one token each
