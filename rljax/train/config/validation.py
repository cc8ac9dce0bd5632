"""Config validation, once, before anything compiles.

Each concern checks its own fields when it is read (`rljax.train.config.fields.Group`); this
module adds the rules that span concerns (`rljax.train.config.rules`), the evaluation sets
and the device mesh. Every problem is reported by field name; all problems are collected
and raised together as one `ConfigError`.
"""

from __future__ import annotations

import jax

from rljax.parallel.mesh import select_devices
from rljax.train.config import algo, groups, rules, task
from rljax.train.config.defaults import (
    EVAL_SET_FIELDS,
    completion_columns,
    model_positions,
    resolved_eval_sets,
)
from rljax.train.config.fields import ConfigError, problems

__all__ = ["ConfigError", "validate"]

GROUPS = (groups.RunSpec, groups.Model, groups.SFT, groups.Optim, groups.Parallel,
          groups.Plan, task.Task, task.Sampling, *algo.CONCERNS)


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
  _check_eval_sets(errors, config)
  _check_devices(errors, config, num_devices)
  limit = max_positions or model_positions(config)
  if columns >= limit:
    errors.append(f"sampling.max_new_tokens={columns} leaves no room for the prompt within "
                  f"the model's {limit} positions")
  if errors:
    raise ConfigError("invalid config:\n  - " + "\n  - ".join(errors), errors)
  return config


def _check_eval_sets(errors, c):
  """Every `eval.sets` entry is a group of known fields, valid once resolved; the held-out
  set keeps the run's own split."""
  sets, first = c.eval.sets, len(errors)
  if "heldout" not in sets:
    errors.append("eval.sets.heldout is missing: it is the run's held-out result "
                  "(heldout_* in result.json)")
  for name, entry in sets.items():
    if not hasattr(entry, "keys"):
      errors.append(f"eval.sets.{name}={entry!r} must be a group "
                    "(rljax.train.config.eval_set(...))")
      continue
    unknown = sorted(set(entry.keys()) - set(EVAL_SET_FIELDS))
    if unknown:
      errors.append(f"eval.sets.{name} has unknown fields {unknown}; its fields: "
                    f"{list(EVAL_SET_FIELDS)}")
  if len(errors) > first:
    return
  for name, f in resolved_eval_sets(c).items():
    try:
      groups.EvalSetSpec(name=name, **f)
    except ConfigError as e:
      errors += e.problems
  held = resolved_eval_sets(c)["heldout"]
  if held["source"] != "heldout" or held["greedy"] is not True:
    errors.append("eval.sets.heldout is the run's held-out result (heldout_acc_* in "
                  "result.json): it keeps source='heldout' and greedy=True")
  if isinstance(held["size"], int) and held["size"] > c.task.heldout_size:
    errors.append(f"eval.sets.heldout.size={held['size']} exceeds task.heldout_size="
                  f"{c.task.heldout_size}, the held-out split")


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
  else:
    _check_mesh(errors, config, devices - max(sampler, 0))


def _check_mesh(errors, c, num_devices):
  p = c.parallel
  if p.expert > 1:   # the expert axis takes its share first (`rljax.parallel.make_mesh`)
    if num_devices % p.expert:
      errors.append(f"parallel.expert={p.expert} does not divide the {num_devices} devices")
      return
    num_devices //= p.expert
  sizes = [p.data, p.fsdp, p.tensor]
  if sum(1 for v in sizes if v == -1) > 1 or any(v == 0 or v < -1 for v in sizes):
    errors.append(f"parallel=(data={p.data}, fsdp={p.fsdp}, tensor={p.tensor}): each must be "
                  ">= 1, at most one may be -1 (all remaining devices)")
    return
  fixed = 1
  for v in sizes:
    fixed *= v if v > 0 else 1
  if num_devices % fixed:
    errors.append(f"parallel: fsdp*tensor*data={fixed} does not divide the {num_devices} devices")
    return
  sizes = [v if v > 0 else num_devices // fixed for v in sizes]   # -1: the remaining devices
  if sizes[0] * sizes[1] * sizes[2] != num_devices:
    errors.append(f"parallel: data*fsdp*tensor={sizes[0] * sizes[1] * sizes[2]} must equal "
                  f"the {num_devices} devices")
    return
  batch_axes = sizes[0] * sizes[1]
  split = max(c.algo.minibatches, 1) * max(c.algo.microbatches, 1)
  micro = max(c.sampling.prompts_per_iteration * c.sampling.n, 0) // split
  if micro % batch_axes:
    errors.append(f"the micro-batch of {micro} sequences is not divisible by the data*fsdp="
                  f"{batch_axes} mesh axes (parallel.data / parallel.fsdp)")
