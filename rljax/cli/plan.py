"""`rljax plan --config EXP [--config.FIELD=...] --topology NAME [--json] [--search N]`.

Compiles every program of one RL iteration for a TPU slice from this host (nothing runs,
no weights are read) and prints what each needs and costs. Exit status: 0 when everything
fits, 3 when something does not (the plan names the largest buffers and the change that
would make it fit), 2 on bad input (a command line, a config, a topology, or libtpu
missing for a TPU topology). `--check` validates the config for the slice's chips and
compiles nothing (no libtpu needed).
"""

from __future__ import annotations

import json
import sys

import jax

from rljax.cli.commands import parse_train_args
from rljax.cli.overrides import UsageError, typed_overrides
from rljax.plan import (
  INSTALL_HINT,
  LibtpuMissing,
  Target,
  TopologyError,
  parse_topology,
  plan,
  result_line,
  text,
)
from rljax.train.config import ConfigError, load_config

EXIT_FITS, EXIT_DOES_NOT_FIT, EXIT_BAD_INPUT = 0, 3, 2


def split_plan_args(argv) -> tuple[dict, list]:
  """({"topology", "json", "check", "search"}, the remaining `--config ...` arguments)."""
  options, rest = {"topology": None, "json": False, "check": False, "search": 3}, []
  args = list(argv)
  while args:
    arg = args.pop(0)
    name, eq, value = arg.partition("=")
    if name in ("--topology", "--search"):
      if not eq:
        if not args:
          raise UsageError(f"{name} needs a value")
        value = args.pop(0)
      options[name[2:]] = value
    elif arg in ("--json", "--check"):
      options[arg[2:]] = True
    else:
      rest.append(arg)
  if not options["topology"]:
    raise UsageError("--topology NAME is required (e.g. v5p-32, v5e-64, v5p:2x2x1, local)")
  try:
    options["search"] = int(options["search"])
  except ValueError as e:
    raise UsageError(f"--search takes a number of candidates, got {options['search']!r}") from e
  return options, rest


def _fail(message: str) -> None:
  print(f"rljax plan: {message}", file=sys.stderr)
  raise SystemExit(EXIT_BAD_INPUT)


def plan_config(argv):
  """The config `rljax plan ARGV` would plan, validated for the topology's chips (nothing is
  compiled and libtpu is not needed).

  Raises:
    UsageError, TopologyError, ConfigError (and the experiment file's own errors).
  """
  options, rest = split_plan_args(argv)
  return _plan_config(options, parse_train_args(rest))


def _plan_config(options, args):
  topology = parse_topology(options["topology"])
  chips = topology.chips or len(jax.devices())
  return load_config(args.spec, typed_overrides(args.overrides), num_devices=chips), topology


def _check(options, args):
  try:
    config, topology = _plan_config(options, args)
  except (TopologyError, ConfigError, FileNotFoundError, KeyError, ValueError) as e:
    _fail(e.args[0] if isinstance(e, KeyError) and e.args else str(e))
  p = config.parallel
  print(f"rljax plan --check: the config is valid for {topology.name} "
        f"({topology.chips or len(jax.devices())} chips; parallel data={p.data} fsdp={p.fsdp} "
        f"tensor={p.tensor}); nothing was compiled")
  return config


def plan_command(argv):
  """`rljax plan ARGV`: prints the plan (`--json`: one JSON object) and exits 0 / 3 / 2
  (`--check`: returns the validated config)."""
  options, rest = split_plan_args(argv)
  args = parse_train_args(rest)
  if options["check"]:
    return _check(options, args)
  # compile-only executables cannot be read back from a persistent cache (no TPU client):
  # writing them there would only fill it
  jax.config.update("jax_enable_compilation_cache", False)
  progress = lambda line: print(f"[rljax plan] {line}", file=sys.stderr, flush=True)  # noqa: E731
  try:
    target = Target.resolve(options["topology"])
  except LibtpuMissing as e:
    _fail(f"{e}\n  install it with: {INSTALL_HINT}")
  except TopologyError as e:
    _fail(str(e))
  progress(f"{options['topology']}: {len(target.devices)} chips")
  try:
    config = load_config(args.spec, typed_overrides(args.overrides),
                         num_devices=len(target.devices))
    result = plan(config, target, search=options["search"], progress=progress)
  except (UsageError, ConfigError, FileNotFoundError, KeyError, ValueError) as e:
    _fail(e.args[0] if isinstance(e, KeyError) and e.args else str(e))
  if options["json"]:
    print(json.dumps(result))
  else:
    print(text(result))
    print(result_line(result))
  raise SystemExit(EXIT_FITS if result["fits"] else EXIT_DOES_NOT_FIT)
