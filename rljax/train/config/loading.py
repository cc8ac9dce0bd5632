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
import pathlib

import jax
from ml_collections import ConfigDict

from rljax.parallel.mesh import mesh_axis_sizes, select_devices
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
  if not isinstance(requested, int) or requested < 0:
    return   # parallel.num_devices' own check names it
  if requested > available:
    errors.append(f"parallel.num_devices={requested} must be in [0, {available}] (0: all devices)")
    return
  if requested and num_devices is None and jax.process_count() > 1:
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
  """What keeps `parallel`'s sizes from tiling `num_devices` and the micro-batch (the rule of
  `rljax.parallel.mesh_axis_sizes`, which `make_mesh` applies); None if fine."""
  p = c.parallel
  if any(problems(groups.Parallel, c)):
    return None   # the fields' own checks name them
  try:
    data, fsdp, _ = mesh_axis_sizes(p.data, p.fsdp, p.tensor, expert=max(p.expert, 1),
                                    num_devices=num_devices)
  except ValueError as e:
    return f"parallel.{e}"
  split = max(c.algo.minibatches, 1) * max(c.algo.microbatches, 1)
  micro = max(c.sampling.prompts_per_iteration * c.sampling.n, 0) // split
  if micro % (data * fsdp):
    return (f"the micro-batch of {micro} sequences is not divisible by the data*fsdp="
            f"{data * fsdp} mesh axes (parallel.data / parallel.fsdp)")
  return None
