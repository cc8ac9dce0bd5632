"""Command line: `rljax train | ablate | eval | plan` (also `python -m rljax`).

  rljax train --config experiments/grpo.py[:arg] [--config.algo.eps_high=0.28 ...] [--check]
  rljax ablate experiments/dapo.py [--seeds 0,1,2 | 0-5] [--set FIELD=VALUE ...] [--out DIR]
               [--check]
  rljax eval --run runs/NAME [--check]
  rljax plan --config EXP[:arg] [--config.FIELD=...] --topology v5p-32 [--json] [--search N]
  rljax reward-model --data prefs.jsonl --model-dir HF_DIR --out OUT [--steps N --lr X ...]

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

import sys

from rljax.cli.commands import (
  TrainArgs,
  ablate_command,
  ablate_configs,
  check_named_files,
  eval_command,
  eval_config,
  parse_train_args,
  train_command,
  train_config,
)
from rljax.cli.overrides import UsageError, parse_field_value, parse_seeds, typed_overrides
from rljax.cli.plan import plan_command, plan_config
from rljax.cli.reward_model import reward_model_command
from rljax.parallel import initialize_distributed

COMMANDS = {"train": train_command, "ablate": ablate_command, "eval": eval_command,
            "plan": plan_command, "reward-model": reward_model_command}


def main(argv=None) -> None:
  """`rljax COMMAND ...` (the console script; returns None, so its exit status is 0)."""
  argv = list(sys.argv[1:] if argv is None else argv)
  if not argv or argv[0] not in COMMANDS:
    print(__doc__)
    raise SystemExit(f"usage: rljax {{{','.join(COMMANDS)}}} ...")
  initialize_distributed()   # multi-host (JAX_* env, SLURM, MPI, TPU pod); no-op otherwise
  try:
    COMMANDS[argv[0]](argv[1:])
  except UsageError as e:
    print(f"rljax {argv[0]}: {e}", file=sys.stderr)
    raise SystemExit(2) from e


__all__ = ["COMMANDS", "TrainArgs", "UsageError", "ablate_configs", "check_named_files",
           "eval_config", "main", "parse_field_value", "parse_seeds", "parse_train_args",
           "plan_config",
           "train_config", "typed_overrides"]
