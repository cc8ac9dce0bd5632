"""Command-line values: every config field set from text in the type of its default.

  numbers       --config.algo.eps_high=0.28   --config.run.iterations=100
  booleans      --config.algo.dynamic_sampling=true (true/false, 1/0, yes/no)
  text          --config.task.hf_config=main  (taken as written, no quotes needed)
  lists         --config.task.reward_fns='["my_rewards.py:concise", "pkg.mod:fn"]'
                (a Python or JSON list) or comma-separated: --config.model.lora_targets=q,v
  nested groups --config.algo.on_truncated_episode.env_error=drop
  named sets    --config.eval.sets.hard.size=256 (a set the experiment file defines; its
                fields are typed like `rljax.train.config.eval_set()`'s)
"""

from __future__ import annotations

import ast
import difflib
import json
import math

from rljax.train.config import ConfigDict, base_config, eval_set

_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


class UsageError(ValueError):
  """A command line that cannot be read: `main` prints it and exits with status 2."""


def _describe(value) -> str:
  if isinstance(value, bool):
    return "a bool (true / false)"
  if isinstance(value, int):
    return "an int"
  if isinstance(value, float):
    return "a number"
  if isinstance(value, str):
    return "text"
  if isinstance(value, (list, tuple)):
    return "a list, e.g. '[\"a\", \"b\"]' or a,b"
  return type(value).__name__


def _literal(text: str):
  """A Python literal, else a JSON value; raises ValueError for neither."""
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
    pass
  try:
    return json.loads(text)
  except ValueError as e:
    raise ValueError(f"{text!r} is neither a Python nor a JSON literal") from e


def _scalar(dotted: str, text: str, default):
  """`text` in the type of `default` (bool, int, float, str) or a ValueError naming both."""
  def bad():
    return ValueError(f"{dotted}={text!r}: expected {_describe(default)} like its default "
                      f"{default!r}")
  stripped = text.strip()
  if isinstance(default, bool):
    if stripped.lower() in _TRUE + _FALSE:
      return stripped.lower() in _TRUE
    raise bad()
  if isinstance(default, int):
    try:
      value = _literal(stripped)
    except ValueError:
      raise bad() from None
    if isinstance(value, bool) or not isinstance(value, int):
      raise bad()
    return value
  if isinstance(default, float):
    try:
      return float(stripped)   # "0.28", "3e-4", "1", "inf"
    except ValueError:
      raise bad() from None
  return text   # text fields take the text as written


def _untyped(text: str):
  """A value for a field without a typed default (None): a literal, `none`, or the text."""
  if text.strip().lower() in ("none", "null"):
    return None
  try:
    return _literal(text.strip())
  except ValueError:
    return text


def parse_field_value(dotted: str, text: str, default):
  """The command-line `text` for the field `dotted`, read in the type of its `default`.

  Args:
    dotted: the field, e.g. "task.reward_fns" (for error messages).
    text: what followed `=` on the command line.
    default: the field's value in the base config; its type decides the parse (None: any
      literal, else the text).
  Returns:
    a bool, int, float, str, list or None.
  Raises:
    ValueError: the text does not read as that type; the message names the field, the
      expected type and the default.
  """
  if isinstance(default, (list, tuple)):
    stripped = text.strip()
    literal = stripped.startswith(("[", "(", "{"))
    if literal:
      try:
        value = _literal(stripped)
      except ValueError as e:
        raise ValueError(f"{dotted}={text!r}: expected {_describe(default)} ({e})") from None
      if not isinstance(value, (list, tuple)):
        raise ValueError(f"{dotted}={text!r}: expected {_describe(default)}")
      items = list(value)
    else:   # comma-separated; "" is the empty list
      items = [part.strip() for part in stripped.split(",")] if stripped else []
    if default:   # elements take the type of the default's first element
      items = [_scalar(f"{dotted}[{i}]", x, default[0]) if isinstance(x, str) else x
               for i, x in enumerate(items)]
      for i, x in enumerate(items):
        if type(x) is not type(default[0]) and not (
            isinstance(default[0], float) and isinstance(x, int) and not isinstance(x, bool)):
          raise ValueError(f"{dotted}[{i}]={x!r}: expected {_describe(default[0])} like "
                           f"{default[0]!r}")
    elif not literal:
      items = [_untyped(x) for x in items]
    return items
  if default is None:
    return _untyped(text)
  return _scalar(dotted, text, default)


def _node(config, dotted: str):
  """The value at `dotted` in a ConfigDict, or a UsageError listing the valid names."""
  node = config
  parts = dotted.split(".")
  for depth, part in enumerate(parts):
    if not hasattr(node, "keys") or part not in node:
      where = ".".join(parts[:depth]) or "the config"
      names = sorted(node.keys()) if hasattr(node, "keys") else []
      close = difflib.get_close_matches(part, names, n=1)
      hint = f"did you mean {'.'.join([*parts[:depth], close[0]])}? " if close else ""
      raise UsageError(f"unknown config field '{dotted}': {hint}{where} has {names}")
    node = node[part]
  return node


def _default(base, dotted: str):
  """The base config's value at `dotted`; a field of a named evaluation set the base config
  does not have (`eval.sets.NAME.FIELD`: a set an experiment file adds) has the type of
  `eval_set()`'s field."""
  parts = dotted.split(".")
  if len(parts) == 4 and parts[:2] == ["eval", "sets"] and parts[2] not in base.eval.sets:
    template = eval_set()
    if parts[3] in template:
      return template[parts[3]]
  return _node(base, dotted)


def typed_overrides(raw: dict[str, str]) -> dict:
  """{"algo.eps_high": "0.28", ...} -> {"algo.eps_high": 0.28, ...}, each value parsed in
  the type of that field in `base_config()`. A group (e.g. `algo.on_truncated_episode`)
  is set field by field (`algo.on_truncated_episode.env_error=drop`).

  Raises:
    UsageError: an unknown field, a group given one value, or a value of the wrong type.
  """

  base = base_config()
  out = {}
  for dotted, text in raw.items():
    default = _default(base, dotted)
    if isinstance(default, ConfigDict):
      raise UsageError(f"{dotted} is a group; set its fields one by one, e.g. "
                       f"{dotted}.{sorted(default.keys())[0]}=... (fields: "
                       f"{sorted(default.keys())})")
    try:
      out[dotted] = parse_field_value(dotted, text, default)
    except ValueError as e:
      raise UsageError(str(e)) from None
  return out


def canonical_text(value) -> str:
  """Text that `rljax.train.config.parse_override_value` reads back as exactly `value`."""
  if isinstance(value, float) and not math.isfinite(value):
    if math.isnan(value):
      raise UsageError("nan cannot be passed to an ablation step")
    return "1e999" if value > 0 else "-1e999"
  return repr(value)


def parse_seeds(text: str) -> list[int] | None:
  """'0,1,2' -> [0, 1, 2]; '0-5' -> [0, 1, 2, 3, 4, 5] (inclusive); '0-2,7' mixes both;
  '' -> None (the config's own seed)."""
  seeds = []
  for part in (p.strip() for p in text.split(",")):
    if not part:
      continue
    lo, dash, hi = part.partition("-")
    try:
      seeds += list(range(int(lo), int(hi) + 1)) if dash else [int(part)]
    except ValueError:
      raise UsageError(f"--seeds {text!r}: expected seeds like 0,1,2 or a range 0-5") from None
    if dash and int(hi) < int(lo):
      raise UsageError(f"--seeds {text!r}: the range {part} is empty")
  if len(set(seeds)) != len(seeds):
    raise UsageError(f"--seeds {text!r} repeats a seed")
  return seeds or None


def split_set(item: str):
  key, sep, value = item.partition("=")
  if not sep:
    raise UsageError(f"--set expects FIELD=VALUE, got {item!r}")
  return key.strip(), value
