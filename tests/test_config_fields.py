"""Every config field is declared once (a default, a one-line doc) and read by the code.

A field nothing reads is a flag that silently does nothing: each field of the base config
must be read outside the config room (`rljax/train/config/`), by its own name
(`config.algo.eps_high`, `fields["eps_low"]`) or by the spec attribute it becomes
(`algo.kl_placement` -> `PolicySourcesSpec.has_reference`).
"""

import ast
import dataclasses
import pathlib

import pytest

from rljax.train.config import algo, base_config, defaults, groups
from rljax.train.config.fields import Group

ROOT = pathlib.Path(__file__).parent.parent / "rljax"
# config field -> the spec attribute (or derived value) the trainer reads instead
SPEC_NAMES = {"algo.kl_placement": "has_reference",
              "sampling.max_total_tokens": "completion_columns"}


def _names_read_outside_config() -> set[str]:
  """Attribute names, imported names and string constants in rljax/ outside the config room."""
  names = set()
  for path in ROOT.rglob("*.py"):
    if "train/config/" in path.as_posix():
      continue
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.Attribute):
        names.add(node.attr)
      elif isinstance(node, ast.alias):
        names.add(node.name)
      elif isinstance(node, ast.Constant) and isinstance(node.value, str):
        names.add(node.value)
  return names


def _fields() -> list[tuple[str, str]]:
  c = base_config()
  return [(group, name) for group in c if group != "eval" for name in c[group]]


def test_every_field_is_read_outside_the_config_room():
  read = _names_read_outside_config()
  unread = []
  for group, name in _fields():
    dotted = f"{group}.{name}"
    if not {name, SPEC_NAMES.get(dotted, name)} & read:
      unread.append(dotted)
  assert not unread, f"config fields nothing outside rljax/train/config reads: {unread}"


GROUPS = [groups.RunSpec, groups.Model, groups.SFT, groups.Optim, groups.Parallel, groups.Plan,
          defaults.EvalSetSpec, groups.Task, groups.Sampling, *algo.CONCERNS]


@pytest.mark.parametrize("group", GROUPS, ids=lambda g: g.__name__)
def test_every_field_has_a_one_line_doc(group):
  for f in dataclasses.fields(group):
    doc = f.metadata.get("doc", "")
    assert doc and "\n" not in doc, f"{group.__name__}.{f.name} has no one-line doc"


def test_each_field_is_declared_by_one_concern():
  """The base config is generated from the concerns: each field once, none left over (the
  policy losses' and estimators' own fields come from their registries)."""
  from rljax.ops.estimators import estimator_fields
  from rljax.ops.policy_loss import policy_loss_fields

  seen = {}
  for group in GROUPS:
    if group is defaults.EvalSetSpec:
      continue
    for f in dataclasses.fields(group):
      key = f"{group.SECTION}.{f.name}"
      assert key not in seen, f"{key} declared by {seen.get(key)} and {group.__name__}"
      seen[key] = group.__name__
  registry = {f"algo.{k}" for k in {**policy_loss_fields(), **estimator_fields()}}
  assert set(seen) | registry == {f"{g}.{n}" for g, n in _fields()}


def test_a_bad_field_is_named_when_its_concern_is_built():
  with pytest.raises(ValueError, match=r"algo\.eps_low=1\.5 must be in \[0, 1\)"):
    algo.Clipping(eps_low=1.5)
  with pytest.raises(ValueError, match=r"sampling\.top_k=-1 must be >= 0 \(0: off\)"):
    groups.Sampling(top_k=-1)
  assert issubclass(algo.Shaping, Group) and algo.Shaping().reward_clip == 0.0
