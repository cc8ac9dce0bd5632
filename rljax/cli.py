"""Command line: `rljax train | ablate | eval` (also `python -m rljax`).

  rljax train --config experiments/grpo.py[:arg] [--config.algo.eps_high=0.28 ...] [--check]
  rljax ablate experiments/dapo.py [--seeds 0,1,2 | 0-5] [--set FIELD=VALUE ...] [--out DIR]
               [--check]
  rljax eval --run runs/NAME [--check]

Every config field can be set, `--config.a.b=v` (or `--config.a.b v`) for `train` and
`--set a.b=v` for `ablate`; the text is read in the type of the field's default in
`rljax.train.config.base_config()`:
  numbers       --config.algo.eps_high=0.28   --config.run.iterations=100
  booleans      --config.algo.dynamic_sampling=true (true/false, 1/0, yes/no)
  text          --config.task.hf_config=main  (taken as written, no quotes needed)
  lists         --config.task.reward_fns='["my_rewards.py:concise", "pkg.mod:fn"]'
                (a Python or JSON list) or comma-separated: --config.model.lora_targets=q,v
  nested groups --config.algo.on_truncated_episode.env_error=drop
`--check` stops after the config is validated and the files it names (JSONL data, a Python
task, reward functions, an environment, a local checkpoint directory) are loaded or found:
nothing is compiled, trained or written.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import difflib
import importlib.util
import json
import math
import pathlib
import sys

_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


class UsageError(ValueError):
  """A command line that cannot be read: `main` prints it and exits with status 2."""


# --------------------------------------------------------------------------- field values


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


def typed_overrides(raw: dict[str, str]) -> dict:
  """{"algo.eps_high": "0.28", ...} -> {"algo.eps_high": 0.28, ...}, each value parsed in
  the type of that field in `base_config()`. A group (e.g. `algo.on_truncated_episode`)
  is set field by field (`algo.on_truncated_episode.env_error=drop`).

  Raises:
    UsageError: an unknown field, a group given one value, or a value of the wrong type.
  """
  from rljax.train.config import ConfigDict, base_config

  base = base_config()
  out = {}
  for dotted, text in raw.items():
    default = _node(base, dotted)
    if isinstance(default, ConfigDict):
      raise UsageError(f"{dotted} is a group; set its fields one by one, e.g. "
                       f"{dotted}.{sorted(default.keys())[0]}=... (fields: "
                       f"{sorted(default.keys())})")
    try:
      out[dotted] = parse_field_value(dotted, text, default)
    except ValueError as e:
      raise UsageError(str(e)) from None
  return out


def _canonical(value) -> str:
  """Text that `rljax.train.config.parse_override_value` reads back as exactly `value`."""
  if isinstance(value, float) and not math.isfinite(value):
    if math.isnan(value):
      raise UsageError("nan cannot be passed to an ablation step")
    return "1e999" if value > 0 else "-1e999"
  return repr(value)


# --------------------------------------------------------------------------- what --check loads


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
  from rljax.rewards.user import user_reward_terms
  from rljax.train.setup import build_task

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
    from rljax.envs import load_env_factory
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
  return lines


# --------------------------------------------------------------------------- rljax train


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
    UsageError: the command line; rljax.train.validate.ConfigError: the config; the
      experiment file's own errors (e.g. an unknown variant).
  """
  from rljax.train.config import load_config

  args = parse_train_args(argv)
  return load_config(args.spec, typed_overrides(args.overrides))


def _train(argv):
  args = parse_train_args(argv)
  config = _or_exit("rljax train", train_config, argv)
  if args.check:
    lines = _or_exit("rljax train", check_named_files, config)
    print("\n".join([f"rljax train --check: {args.spec} is valid (run.dir={config.run.dir})",
                     *lines, "nothing was trained or written"]))
    return config
  from rljax.train.loop import train

  result = train(config)
  print("RESULT " + json.dumps(result))
  return result


# --------------------------------------------------------------------------- rljax ablate


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


def _ablate_parser():
  parser = argparse.ArgumentParser(prog="rljax ablate")
  parser.add_argument("experiment", help="experiments/NAME.py with ABLATION_STEPS")
  parser.add_argument("--out", default=None, help="output directory (default runs/ablate_NAME)")
  parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                      help="override for every step, e.g. --set run.iterations=20")
  parser.add_argument("--seeds", default="", metavar="S,S,...|A-B",
                      help="run every step with each run.seed (0,1,2 or 0-5): mean ± sd per cell")
  parser.add_argument("--check", action="store_true",
                      help="validate every step's config and the files it names, run nothing")
  return parser


def _experiment_steps(path: pathlib.Path) -> tuple[str, ...]:
  if not path.is_file():
    raise UsageError(f"experiment file not found: {path}")
  spec = importlib.util.spec_from_file_location(f"rljax_cli_{path.stem}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  steps = tuple(getattr(module, "ABLATION_STEPS", ()))
  if not steps:
    raise UsageError(f"{path} defines no ABLATION_STEPS tuple")
  return steps


def ablate_configs(argv):
  """[(step, seed, validated config)] for every run `rljax ablate ARGV` would make, with the
  run directories `rljax.train.ablate.run_ablation` gives them; nothing runs."""
  from rljax.train.config import load_config

  args = _ablate_parser().parse_args(argv)
  seeds = parse_seeds(args.seeds)
  sets = typed_overrides(dict(_split_set(item) for item in args.set))
  path = pathlib.Path(args.experiment)
  out = pathlib.Path(args.out or f"runs/ablate_{path.stem}")
  plan = []
  for seed in seeds or [None]:
    for step in _experiment_steps(path):
      where = out / step if seed is None else out / step / f"seed{seed}"
      extra = {"run.dir": str(where)} | ({} if seed is None else {"run.seed": seed})
      plan.append((step, seed, load_config(f"{args.experiment}:{step}", {**sets, **extra})))
  return plan


def _split_set(item: str):
  key, sep, value = item.partition("=")
  if not sep:
    raise UsageError(f"--set expects FIELD=VALUE, got {item!r}")
  return key.strip(), value


def _ablate(argv):
  args = _ablate_parser().parse_args(argv)
  plan = _or_exit("rljax ablate", ablate_configs, argv)   # every step validated up front
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
  from rljax.train.ablate import run_ablation

  sets = typed_overrides(dict(_split_set(item) for item in args.set))
  report = run_ablation(args.experiment, out_dir=args.out, seeds=parse_seeds(args.seeds),
                        overrides=[f"{k}={_canonical(v)}" for k, v in sets.items()])
  print(f"report: {report}")
  return report


# --------------------------------------------------------------------------- rljax eval


def _eval_parser():
  parser = argparse.ArgumentParser(prog="rljax eval")
  parser.add_argument("--run", required=True, help="run directory")
  parser.add_argument("--check", action="store_true",
                      help="validate the run's saved config, evaluate nothing")
  return parser


def eval_config(argv):
  """The validated config of the run `rljax eval ARGV` would evaluate (its config.json on
  top of the base config, so runs saved before a field existed still read)."""
  from rljax.train.config import base_config
  from rljax.train.validate import validate

  args = _eval_parser().parse_args(argv)
  path = pathlib.Path(args.run) / "config.json"
  if not path.is_file():
    raise UsageError(f"{args.run} holds no config.json: is it a run directory?")
  config = base_config()
  _merge(config, json.loads(path.read_text()))
  return validate(config)


def _merge(config, saved: dict):
  for key, value in saved.items():
    if isinstance(value, dict) and key in config and hasattr(config[key], "keys"):
      _merge(config[key], value)
    else:
      config[key] = value


def _eval(argv):
  args = _eval_parser().parse_args(argv)
  config = _or_exit("rljax eval", eval_config, argv)
  if args.check:
    print(f"rljax eval --check: {args.run}/config.json is valid; nothing was evaluated")
    return config
  from rljax.train.ablate import evaluate_run

  result = evaluate_run(args.run)
  print("RESULT " + json.dumps(result))
  return result


# --------------------------------------------------------------------------- entry point


def _or_exit(prog, fn, *args):
  """fn(*args); a bad command line or config ends the program with its message (exit 2)."""
  from rljax.train.validate import ConfigError

  try:
    return fn(*args)
  except (UsageError, ConfigError, FileNotFoundError, KeyError, ValueError) as e:
    message = e.args[0] if isinstance(e, KeyError) and e.args else e
    print(f"{prog}: {message}", file=sys.stderr)
    raise SystemExit(2) from e


COMMANDS = {"train": _train, "ablate": _ablate, "eval": _eval}


def main(argv=None) -> None:
  """`rljax COMMAND ...` (the console script; returns None, so its exit status is 0)."""
  argv = list(sys.argv[1:] if argv is None else argv)
  if not argv or argv[0] not in COMMANDS:
    print(__doc__)
    raise SystemExit(f"usage: rljax {{{','.join(COMMANDS)}}} ...")
  from rljax.parallel import initialize_distributed

  initialize_distributed()   # multi-host (JAX_* env, SLURM, MPI, TPU pod); no-op otherwise
  try:
    COMMANDS[argv[0]](argv[1:])
  except UsageError as e:
    print(f"rljax {argv[0]}: {e}", file=sys.stderr)
    raise SystemExit(2) from e


if __name__ == "__main__":
  main()
