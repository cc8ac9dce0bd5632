"""How a concern of the config is declared: once, as a frozen dataclass.

A concern (`Sampling`, `Clipping`, `Shaping`, ...) lists its fields with their defaults and a
one-line doc (`field(0.2, "doc")`), and states its own checks in `check`. The ConfigDict
sections (the public override API, `--config.algo.eps_high=0.28`) are generated from the
concerns (`section`), validation reads each concern back from the config (`read`), and the
specs the trainer reads are filled from the concerns by name (`rljax.train.config.specs`).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import ClassVar

from ml_collections import ConfigDict


class ConfigError(ValueError):
  """A config has one or more invalid fields; the message names each one (several: one a
  line under "invalid config:")."""

  def __init__(self, problems: str | list[str]):
    self.problems = [problems] if isinstance(problems, str) else list(problems)
    super().__init__(problems if isinstance(problems, str)
                     else "invalid config:\n  - " + "\n  - ".join(self.problems))


def field(default, doc: str, rule=None):
  """A config field: its default, its one-line doc and its own check (`metadata`).

  Args:
    rule: None | the allowed values (a tuple or a registry dict) | a bound: ">= 0",
      "> 0", "int >= 1", "0 or > 1", "[0, 1)", ..., with an optional note ("(0: off)").
  """
  meta = {"doc": doc, "rule": rule}
  if isinstance(default, (list, dict)):
    return dataclasses.field(default_factory=lambda: copy.deepcopy(default), metadata=meta)
  return dataclasses.field(default=default, metadata=meta)


def _holds(value, rule: str) -> bool:
  """Whether `value` satisfies the bound `rule` (see `field`)."""
  rule = rule.split(" (")[0]
  if rule.startswith("int "):
    return isinstance(value, int) and _holds(value, rule[4:])
  if rule.startswith("0 or "):
    return value == 0 or _holds(value, rule[5:])
  if not isinstance(value, (int, float)) or isinstance(value, bool):
    return False
  if rule[0] in "[(":
    low, high = (float(x) for x in rule[1:-1].split(","))
    return ((low <= value) if rule[0] == "[" else (low < value)) and (
        (value <= high) if rule[-1] == "]" else (value < high))
  op, bound = rule.split()
  return value >= float(bound) if op == ">=" else value > float(bound)


class Checks:
  """Collects a concern's problems, each naming its field as `section.field=value`."""

  def __init__(self, group):
    self.group, self.problems = group, []

  def need(self, ok, name: str, text: str):
    """Reports `section.name=value text` unless `ok`."""
    if not ok:
      sep = "" if text.startswith(":") else " "
      self.problems.append(f"{self.group.where}.{name}={getattr(self.group, name)!r}{sep}{text}")


@dataclasses.dataclass(frozen=True)
class Group:
  """A concern of the config: its fields, their defaults and docs, and its own checks.

  Building one runs the one coercion every field gets (an int into a `float` field, a list
  into a `tuple` field, a group into a `dict` field), each field's rule and the concern's
  `check`; the problems raise one `ConfigError` naming each field.
  """

  SECTION: ClassVar[str] = ""

  @property
  def where(self) -> str:
    """The config path of this concern's fields (`algo`, `eval.sets.hard`, ...)."""
    return self.SECTION

  def __post_init__(self):
    for f in dataclasses.fields(self):
      value = getattr(self, f.name)
      if f.type == "float" and isinstance(value, int) and not isinstance(value, bool):
        object.__setattr__(self, f.name, float(value))
      elif str(f.type).startswith("tuple") and isinstance(value, list):
        object.__setattr__(self, f.name, tuple(value))
      elif f.type == "dict" and hasattr(value, "to_dict"):
        object.__setattr__(self, f.name, value.to_dict())
    checks = Checks(self)
    for f in dataclasses.fields(self):
      rule, value = f.metadata.get("rule"), getattr(self, f.name)
      if isinstance(rule, str):
        text = f"in {rule}" if rule[0] in "[(" else rule.replace("int ", "an int ")
        checks.need(_holds(value, rule), f.name, f"must be {text}")
      elif rule is not None:
        checks.need(value in rule, f.name, f"is not one of {list(rule)}")
    self.check(checks)
    if checks.problems:
      raise ConfigError(checks.problems)

  def check(self, checks: Checks):
    """The concern's own checks (fields of this concern only); none by default."""


def section(*groups: type[Group], **extra) -> ConfigDict:
  """The ConfigDict section of these concerns' fields (with `extra` fields after them), at
  their defaults: tuples become lists and dicts groups, as the override API has them."""
  out = {}
  for group in groups:
    defaults = group()
    for f in dataclasses.fields(group):
      value = getattr(defaults, f.name)
      out[f.name] = (list(value) if isinstance(value, tuple)
                     else ConfigDict(value) if isinstance(value, dict) else value)
  return ConfigDict({**out, **extra})


def read(group: type[Group], config) -> Group:
  """The concern `group` as `config` sets it (raises ConfigError naming each bad field)."""
  node = config[group.SECTION]
  return group(**{f.name: node[f.name] for f in dataclasses.fields(group)})


def problems(group: type[Group], config) -> list[str]:
  """The concern's problems in `config` (empty when it is valid)."""
  try:
    read(group, config)
  except ConfigError as e:
    return e.problems
  return []
