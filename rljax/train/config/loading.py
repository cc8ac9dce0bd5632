"""Loading an experiment file, and validating a config once, before anything compiles.

An experiment is a Python file with `get_config(arg: str | None) -> ConfigDict` (the
Flax-examples / big_vision convention); an ablation file also names its steps in
`ABLATION_STEPS`. `load_config("experiments/dapo.py:clip_higher", {"algo.eps_high": 0.3})`
imports it, locks the result (unknown keys fail), applies the dotted overrides and
validates it: each concern checks its own fields when it is read
(`rljax.train.config.fields.Group`), then come the rules that span concerns
(`rljax.train.config.rules`), the evaluation sets and the device mesh. All problems are
raised together as one `ConfigError`, each naming its field.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import math
import pathlib

import jax
from ml_collections import ConfigDict

from rljax.parallel.mesh import select_devices
from rljax.train.config import algo, groups, rules
from rljax.train.config.defaults import (
    base_config,
    completion_columns,
    eval_set_problems,
    model_positions,
)
from rljax.train.config.fields import ConfigError, problems

GROUPS = (groups.RunSpec, groups.Model, groups.SFT, groups.Optim, groups.Parallel,
          groups.Plan, groups.Task, groups.Sampling, *algo.CONCERNS)


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


def validate(config, *, num_devices: int | None = None, max_positions: int | None = None):
  """Raises ConfigError naming every invalid field. Returns the config unchanged.

  Args:
    config: a full config (rljax.train.config.base_config() plus changes).
    num_devices: devices of the mesh (default: jax.device_count()).
    max_positions: the model's position limit, when known (checked against prompt +
      completion length).
  """
  errors: list[str] = [p for group in GROUPS for p in problems(group, config)]
  columns = completion_columns(config)
  for rule in rules.RULES:
    errors += [message for bad, message in rule(config, columns) if bad]
  errors += eval_set_problems(config)
  _check_devices(errors, config, num_devices)
  limit = max_positions or model_positions(config)
  if columns >= limit:
    errors.append(f"sampling.max_new_tokens={columns} leaves no room for the prompt within "
                  f"the model's {limit} positions")
  if errors:
    raise ConfigError(errors)
  return config


def _check_devices(errors, config, num_devices):
  """parallel.num_devices and the sampler's own devices against the devices there are."""
  available = jax.device_count() if num_devices is None else num_devices
  requested = config.parallel.num_devices
  if requested < 0 or requested > available:
    errors.append(f"parallel.num_devices={requested} must be in [0, {available}] (0: all devices)")
  elif requested and num_devices is None and jax.process_count() > 1:
    try:   # several processes: each must contribute the same number of its devices
      select_devices(requested)
    except ValueError as e:
      errors.append(str(e))
  devices = requested or available
  sampler = config.parallel.sampler_devices if isinstance(config.parallel.sampler_devices,
                                                          int) else 0
  if 0 < sampler and sampler >= devices:
    errors.append(f"parallel.sampler_devices={sampler} leaves the trainer none of the "
                  f"{devices} devices")
  elif problem := _mesh_problem(config, devices - max(sampler, 0)):
    errors.append(problem)


def _mesh_problem(c, num_devices) -> str | None:
  """What keeps `parallel`'s sizes from tiling `num_devices` and the micro-batch; None if fine."""
  p = c.parallel
  if p.expert > 1:   # the expert axis takes its share first (`rljax.parallel.make_mesh`)
    if num_devices % p.expert:
      return f"parallel.expert={p.expert} does not divide the {num_devices} devices"
    num_devices //= p.expert
  sizes = [p.data, p.fsdp, p.tensor]
  if sum(1 for v in sizes if v == -1) > 1 or any(v == 0 or v < -1 for v in sizes):
    return (f"parallel=(data={p.data}, fsdp={p.fsdp}, tensor={p.tensor}): each must be "
            ">= 1, at most one may be -1 (all remaining devices)")
  fixed = math.prod(v for v in sizes if v > 0)
  if num_devices % fixed:
    return f"parallel: fsdp*tensor*data={fixed} does not divide the {num_devices} devices"
  sizes = [v if v > 0 else num_devices // fixed for v in sizes]   # -1: the remaining devices
  if math.prod(sizes) != num_devices:
    return f"parallel: data*fsdp*tensor={math.prod(sizes)} must equal the {num_devices} devices"
  batch_axes = sizes[0] * sizes[1]
  split = max(c.algo.minibatches, 1) * max(c.algo.microbatches, 1)
  micro = max(c.sampling.prompts_per_iteration * c.sampling.n, 0) // split
  if micro % batch_axes:
    return (f"the micro-batch of {micro} sequences is not divisible by the data*fsdp="
            f"{batch_axes} mesh axes (parallel.data / parallel.fsdp)")
  return None
