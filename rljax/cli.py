"""Command line: `rljax train | ablate | eval` (also `python -m rljax`).

  rljax train --config experiments/grpo.py[:step] [--config.algo.eps_high=0.28 ...]
  rljax ablate experiments/dapo.py [--seeds 0,1,2] [--set FIELD=VALUE] [--out DIR]
  rljax eval --run runs/NAME
"""

from __future__ import annotations

import argparse
import json
import sys


def _train(argv):
  from absl import flags
  from ml_collections import config_flags

  from rljax.train.loop import train

  flag_values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "experiment file[:arg]", lock_config=True,
                                  flag_values=flag_values)
  flag_values(["rljax-train"] + argv)
  if flag_values.config is None:
    raise SystemExit("rljax train: --config experiments/NAME.py[:arg] is required")
  result = train(flag_values.config)
  print("RESULT " + json.dumps(result))


def _ablate(argv):
  from rljax.train.ablate import run_ablation

  parser = argparse.ArgumentParser(prog="rljax ablate")
  parser.add_argument("experiment", help="experiments/NAME.py with ABLATION_STEPS")
  parser.add_argument("--out", default=None, help="output directory (default runs/ablate_NAME)")
  parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                      help="override for every step, e.g. --set run.iterations=20")
  parser.add_argument("--seeds", default="", metavar="S,S,...",
                      help="run every step with each run.seed (e.g. 0,1,2): mean ± sd per cell")
  args = parser.parse_args(argv)
  seeds = [int(s) for s in args.seeds.split(",") if s.strip()] or None
  report = run_ablation(args.experiment, out_dir=args.out, overrides=args.set, seeds=seeds)
  print(f"report: {report}")


def _eval(argv):
  from rljax.train.ablate import evaluate_run

  parser = argparse.ArgumentParser(prog="rljax eval")
  parser.add_argument("--run", required=True, help="run directory")
  args = parser.parse_args(argv)
  print("RESULT " + json.dumps(evaluate_run(args.run)))


COMMANDS = {"train": _train, "ablate": _ablate, "eval": _eval}


def main(argv=None):
  argv = list(sys.argv[1:] if argv is None else argv)
  if not argv or argv[0] not in COMMANDS:
    print(__doc__)
    raise SystemExit(f"usage: rljax {{{','.join(COMMANDS)}}} ...")
  from rljax.parallel import initialize_distributed

  initialize_distributed()   # multi-host (JAX_* env, SLURM, MPI, TPU pod); no-op otherwise
  COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
  main()
