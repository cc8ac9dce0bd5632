"""Loading an experiment file: import it, lock the config, apply overrides, validate.

An experiment is a Python file with `get_config(arg: str | None) -> ConfigDict` (the
Flax-examples / big_vision convention); an ablation file also names its steps in
`ABLATION_STEPS`. `load_config("experiments/dapo.py:clip_higher", {"algo.eps_high": 0.3})`
imports it, locks the result (unknown keys fail), applies the dotted overrides and
validates it once, up front (`rljax.train.config.validation`).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import pathlib

from ml_collections import ConfigDict

from rljax.train.config.defaults import base_config
from rljax.train.config.validation import validate


def import_experiment(path) -> object:
  """The experiment file at `path` as a module (its `get_config`, `ABLATION_STEPS`)."""
  path = pathlib.Path(path)
  spec = importlib.util.spec_from_file_location(f"rljax_experiment_{path.stem}", path)
  if spec is None or spec.loader is None:
    raise FileNotFoundError(f"cannot import experiment file {path}")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def load_config(spec: str, overrides: dict | None = None, *,
                num_devices: int | None = None) -> ConfigDict:
  """Loads `path[:arg]`, locks it, applies dotted overrides and validates it.

  Args:
    spec: "experiments/grpo.py" or "experiments/dapo.py:clip_higher".
    overrides: {"algo.eps_high": 0.28, ...}; an unknown key raises KeyError.
    num_devices: the devices the mesh is checked against (default: this host's; `rljax
      plan` passes the target slice's chips).
  """
  path_str, _, arg = spec.partition(":")
  path = pathlib.Path(path_str)
  if not path.is_file():
    raise FileNotFoundError(f"experiment file not found: {path}")
  return module_config(import_experiment(path), arg, overrides, num_devices=num_devices,
                       path=path)


def module_config(module, arg: str | None, overrides: dict | None = None, *,
                  num_devices: int | None = None, path=None) -> ConfigDict:
  """`load_config` of an experiment file imported already (`import_experiment`): an ablation
  builds every step's config from one import.

  Args:
    path: the file's path, for the error message (default: the module's `__file__`).
  """
  if not callable(getattr(module, "get_config", None)):
    raise ValueError(f"{path or module.__file__} defines no get_config(arg) function: an "
                     "experiment file returns its config from get_config(arg: str | None)")
  config = module.get_config(arg or None)
  config.lock()
  apply_overrides(config, overrides or {})
  validate(config, num_devices=num_devices)
  return config


def apply_overrides(config: ConfigDict, overrides: dict) -> ConfigDict:
  """Sets dotted fields in place; unknown groups or fields fail with the field name."""
  for dotted, value in overrides.items():
    *groups, leaf = dotted.split(".")
    node = config
    for g in groups:
      if g not in node:
        raise KeyError(f"unknown config group '{g}' in '{dotted}'; groups: {sorted(node.keys())}")
      node = node[g]
    if leaf not in node:
      raise KeyError(f"unknown config field '{dotted}'; fields of this group: {sorted(node.keys())}")
    node[leaf] = value
  return config


def parse_override_value(text: str):
  """'0.28' -> 0.28, 'true' -> True, 'grpo' -> 'grpo' (command-line overrides)."""
  lowered = text.lower()
  if lowered in ("true", "false"):
    return lowered == "true"
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return text


def saved_config(run_dir) -> ConfigDict:
  """A run's `config.json` over the base config (fields added since it was written keep
  their defaults; fields removed since are ignored). Not validated."""
  config = base_config()
  saved = json.loads((pathlib.Path(run_dir) / "config.json").read_text())
  for group, fields in saved.items():
    if group in config and isinstance(fields, dict):
      for name, value in fields.items():
        if name in config[group]:
          config[group][name] = value
  return config
