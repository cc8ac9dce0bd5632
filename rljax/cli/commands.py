"""The commands: `rljax train`, `rljax ablate`, `rljax eval`, each with `--check`."""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys

from rljax.cli.overrides import (
  UsageError,
  canonical_text,
  parse_seeds,
  split_set,
  typed_overrides,
)
from rljax.envs import load_env_factory
from rljax.rewards.user import user_reward_terms
from rljax.train.ablate.finished import finished_runs
from rljax.train.ablate.runner import plan as ablation_plan
from rljax.train.ablate.runner import run_ablation
from rljax.train.config import (
  ConfigError,
  import_experiment,
  load_config,
  saved_config,
  validate,
)
from rljax.train.config.defaults import distill_teacher_dir
from rljax.train.run.heldout import evaluate_run
from rljax.train.run.loop import train_validated
from rljax.train.run.task_and_models import build_task


def check_named_files(config) -> list[str]:
  """Loads what a validated config names on disk, as the run would, without a model.

  The task's prompts (synthetic, JSONL, or a `task.python` factory), `task.reward_fns`,
  the `task.env` factory; `model.hf_path`, `task.reward_model_path` and
  `algo.critic_init_path` must be directories. Hugging Face datasets and TFDS are not
  loaded (they may need the network or a prepared dataset).

  Returns:
    one line per thing checked.
  Raises:
    ValueError (or the loader's own error) naming the config field.
  """
  t, lines = config.task, []
  if t.name in ("hf_dataset", "tfds"):
    source = t.hf_path if t.name == "hf_dataset" else t.tfds_name
    lines.append(f"task.name={t.name!r}: {source!r} is not loaded by --check")
  else:
    task = build_task(config)
    lines.append(f"task {t.name!r}: {len(task.train_prompts())} train and "
                 f"{len(task.heldout_prompts())} held-out prompts")
  if len(t.reward_fns):
    terms = user_reward_terms(list(t.reward_fns), list(t.reward_weights))
    lines.append("task.reward_fns: " + ", ".join(f"{n} (weight {w:g})" for n, _, w in terms))
  if t.env:
    load_env_factory(t.env)
    lines.append(f"task.env: {t.env}")
  for field, value in (("model.hf_path", config.model.hf_path),
                       ("task.reward_model_path", t.reward_model_path),
                       ("algo.critic_init_path", config.algo.critic_init_path)):
    if value and not pathlib.Path(value).is_dir():
      raise ValueError(f"{field}={value!r} is not a directory (rljax reads local checkpoints "
                       "and downloads nothing)")
    if value:
      lines.append(f"{field}: {value}")
  if config.algo.distill_teacher:   # validation checked it exists, or a recipe trains it
    recipe = config.algo.distill_teacher_recipe
    lines.append(f"algo.distill_teacher: {distill_teacher_dir(config)}"
                 + (f" (trained first by {recipe} when absent)" if recipe else ""))
  return lines


@dataclasses.dataclass
class TrainArgs:
  spec: str                  # "experiments/NAME.py[:arg]"
  overrides: dict            # {"a.b": "text as given"}
  check: bool = False


def parse_train_args(argv) -> TrainArgs:
  """`--config FILE[:arg]` (or `--config=FILE`), `--config.a.b=v` / `--config.a.b v`, and
  `--check`, in any order (the ml_collections `config_flags` spelling)."""
  spec, overrides, check = None, {}, False
  args = list(argv)
  i = 0
  while i < len(args):
    arg = args[i]
    i += 1
    if arg in ("-h", "--help"):
      print(__doc__)
      raise SystemExit(0)
    if arg == "--check":
      check = True
      continue
    name, eq, value = arg.partition("=")
    if name == "--config":
      if not eq:
        if i >= len(args):
          raise UsageError("--config needs a file: --config experiments/NAME.py[:arg]")
        value, i = args[i], i + 1
      spec = value
    elif name.startswith("--config."):
      if not eq:
        if i >= len(args) or args[i].startswith("--"):
          raise UsageError(f"{name} needs a value: {name}=VALUE")
        value, i = args[i], i + 1
      field = name[len("--config."):]
      if field in overrides:
        raise UsageError(f"--config.{field} is given twice")
      overrides[field] = value
    else:
      raise UsageError(f"unexpected argument {arg!r}; expected --config FILE[:arg], "
                       "--config.FIELD=VALUE or --check")
  if spec is None:
    raise UsageError("--config experiments/NAME.py[:arg] is required")
  return TrainArgs(spec, overrides, check)


def train_config(argv):
  """The validated config `rljax train ARGV` would run (nothing is built or written).

  Raises:
    UsageError: the command line; rljax.train.config.ConfigError: the config; the
      experiment file's own errors (e.g. an unknown variant).
  """
  return _train_config(parse_train_args(argv))


def _train_config(args: TrainArgs):
  return load_config(args.spec, typed_overrides(args.overrides))


def train_command(argv):
  """`rljax train ARGV`: the run (or, with --check, the validated config and its files).
  The command line is parsed once and the config validated once (by `load_config`)."""
  args = parse_train_args(argv)
  config = _or_exit("rljax train", _train_config, args)
  if args.check:
    lines = _or_exit("rljax train", check_named_files, config)
    print("\n".join([f"rljax train --check: {args.spec} is valid (run.dir={config.run.dir})",
                     *lines, "nothing was trained or written"]))
    return config

  result = train_validated(config)
  print("RESULT " + json.dumps(result))
  return result


def _ablate_parser():
  parser = argparse.ArgumentParser(prog="rljax ablate")
  parser.add_argument("experiment", help="experiments/NAME.py with ABLATION_STEPS")
  parser.add_argument("--out", default=None, help="output directory (default runs/ablate_NAME)")
  parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                      help="override for every step, e.g. --set run.iterations=20")
  parser.add_argument("--seeds", default="", metavar="S,S,...|A-B",
                      help="run every step with each run.seed (0,1,2 or 0-5): paired effects")
  parser.add_argument("--steps", default="", metavar="STEP,STEP,...",
                      help="these steps instead of ABLATION_STEPS; STEP@LABEL repeats a step "
                           "with its own sampling noise (an A/A control)")
  parser.add_argument("--aa", action="store_true",
                      help="add an A/A copy of the first step (FIRST@aa: the same config, its "
                           "own sampling noise)")
  parser.add_argument("--report-only", action="store_true",
                      help="rebuild the report from the finished runs in --out, train nothing")
  parser.add_argument("--check", action="store_true",
                      help="validate every step's config and the files it names, run nothing")
  return parser


def _ablate_args(argv):
  """(parsed arguments, the runner's options): the options carry the experiment file,
  imported once here (`module`), which the plan and the runner read."""
  args = _ablate_parser().parse_args(argv)
  if not pathlib.Path(args.experiment).is_file():
    raise UsageError(f"experiment file not found: {args.experiment}")
  sets = typed_overrides(dict(split_set(item) for item in args.set))
  steps = [s.strip() for s in args.steps.split(",") if s.strip()] or None
  module = import_experiment(args.experiment)
  if steps is None and not getattr(module, "ABLATION_STEPS", None):
    raise UsageError(f"{args.experiment} defines no ABLATION_STEPS tuple (or pass --steps)")
  return args, dict(out_dir=args.out, seeds=parse_seeds(args.seeds), steps=steps, aa=args.aa,
                    overrides=[f"{k}={canonical_text(v)}" for k, v in sets.items()],
                    module=module)


def ablate_configs(argv):
  """[(step, seed, validated config)] for every run `rljax ablate ARGV` would make, with the
  run directories and settings `rljax.train.ablate.runner.run_ablation` gives them; nothing
  runs."""
  args, options = _ablate_args(argv)
  return ablation_plan(args.experiment, **options)


def ablate_command(argv):
  """`rljax ablate ARGV`: every step of the experiment file over the seeds, and the report.
  The experiment file is imported once and every run's config validated once, up front."""
  args, options = _or_exit("rljax ablate", _ablate_args, argv)
  plan = _or_exit("rljax ablate", lambda: ablation_plan(args.experiment, **options))
  if args.check:
    lines = []
    for step, seed, config in plan:
      if seed == plan[0][1]:   # the files a step names are the same for every seed
        lines += [f"  {step}: " + "; ".join(_or_exit("rljax ablate", check_named_files, config))]
    seeds = sorted({seed for _, seed, _ in plan}, key=lambda s: -1 if s is None else s)
    print("\n".join([f"rljax ablate --check: {len(plan)} runs valid "
                     f"({len(plan) // len(seeds)} steps x seeds {seeds})", *lines,
                     "nothing was trained or written"]))
    return plan
  _or_exit("rljax ablate", lambda: finished_runs(plan, report_only=args.report_only))
  report = run_ablation(args.experiment, **options, report_only=args.report_only, runs=plan)
  print(f"report: {report}")
  return report


def _eval_parser():
  parser = argparse.ArgumentParser(prog="rljax eval")
  parser.add_argument("--run", required=True, help="run directory")
  parser.add_argument("--check", action="store_true",
                      help="validate the run's saved config, evaluate nothing")
  return parser


def eval_config(argv):
  """The validated config of the run `rljax eval ARGV` would evaluate (its config.json on
  top of the base config, so runs saved before a field existed still read)."""
  return _eval_config(_eval_parser().parse_args(argv))


def _eval_config(args):
  if not (pathlib.Path(args.run) / "config.json").is_file():
    raise UsageError(f"{args.run} holds no config.json: is it a run directory?")
  return validate(saved_config(args.run))


def eval_command(argv):
  """`rljax eval --run DIR`: the latest checkpoint's held-out metrics as a RESULT line."""
  args = _eval_parser().parse_args(argv)
  config = _or_exit("rljax eval", _eval_config, args)
  if args.check:
    print(f"rljax eval --check: {args.run}/config.json is valid; nothing was evaluated")
    return config

  result = evaluate_run(args.run, config=config)
  print("RESULT " + json.dumps(result))
  return result


def _or_exit(prog, fn, *args):
  """fn(*args); a bad command line or config ends the program with its message (exit 2)."""
  try:
    return fn(*args)
  except (UsageError, ConfigError, FileNotFoundError, KeyError, ValueError) as e:
    message = e.args[0] if isinstance(e, KeyError) and e.args else e
    print(f"{prog}: {message}", file=sys.stderr)
    raise SystemExit(2) from e
