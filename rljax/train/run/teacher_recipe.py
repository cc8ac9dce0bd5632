"""On-policy distillation's teacher, trained first when the run names a recipe for it.

With `algo.distill_teacher = "runs/distill_teacher/seed{seed}"` and
`algo.distill_teacher_recipe = "experiments/grpo.py"`, a run whose teacher directory holds
no finished run (its `result.json`) first trains that experiment into it, with the run's
own seed; every later run (each step of an ablation, a resumed run) finds it there and
reuses it, as the SFT warm start is cached. An interrupted teacher resumes from its own
checkpoints.
"""

from __future__ import annotations

import pathlib

from rljax import parallel
from rljax.train.config import load_config
from rljax.train.config.specs import DistillSpec


def teacher_finished(directory) -> bool:
  """True when `directory` holds a finished rljax run (`train` writes `result.json` last)."""
  return (pathlib.Path(directory) / "result.json").is_file()


def train_teacher_if_absent(spec: DistillSpec | None, train_fn):
  """Trains `spec.recipe` into `spec.teacher` with seed `spec.seed` unless it is there.

  Args:
    spec: the run's distillation spec (None: no distillation, nothing to do).
    train_fn: `rljax.train.loop.train` (passed in: the loop imports this module).
  Returns:
    the teacher run's RESULT dict when it was trained now, else None.
  """
  if spec is None or not spec.recipe or teacher_finished(spec.teacher):
    return None
  config = load_config(spec.recipe, {"run.seed": spec.seed, "run.dir": spec.teacher})
  if parallel.is_primary():
    print(f"[rljax] training the distillation teacher: {spec.recipe} (seed {spec.seed}) "
          f"-> {spec.teacher}")
  return train_fn(config)
