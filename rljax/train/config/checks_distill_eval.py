"""Checks of on-policy distillation (`algo.distill_*`) and the named evaluation sets
(`eval.sets`), one function each (called by `rljax.train.config.validation`)."""

from __future__ import annotations

import pathlib
import re

from rljax.data.tasks import TASKS
from rljax.train.config.defaults import EVAL_SET_FIELDS, distill_teacher_dir, resolved_eval_sets

DISTILL_MODES = ("advantage", "reward")
TEACHER_DTYPES = ("", "float32", "bfloat16")
_SET_NAME = re.compile(r"[A-Za-z0-9_-]+")


def _is_number(x) -> bool:
  return isinstance(x, (int, float)) and not isinstance(x, bool)


def check_distill(errors, c):
  """The teacher, its coefficient and mode, and what distillation does not combine with."""
  a = c.algo
  if a.distill_mode not in DISTILL_MODES:
    errors.append(f"algo.distill_mode={a.distill_mode!r} is not one of {list(DISTILL_MODES)}")
  if a.distill_teacher_dtype not in TEACHER_DTYPES:
    errors.append(f"algo.distill_teacher_dtype={a.distill_teacher_dtype!r} is not one of "
                  f"{list(TEACHER_DTYPES)}")
  if not _is_number(a.distill_coef) or a.distill_coef < 0:
    errors.append(f"algo.distill_coef={a.distill_coef!r} must be a number >= 0")
  if not a.distill_teacher:
    for on, what in ((a.distill_only, "algo.distill_only=True"),
                     (a.distill_teacher_recipe, "algo.distill_teacher_recipe"),
                     (a.rsft_from_teacher, "algo.rsft_from_teacher=True")):
      if on:
        errors.append(f"{what} needs a teacher: set algo.distill_teacher")
    return
  if a.distill_only and not a.distill_coef:
    errors.append("algo.distill_only=True with algo.distill_coef=0 leaves nothing to train "
                  "the policy")
  if a.old_logp_source == "update":
    errors.append("algo.distill_teacher compares the teacher with the student's old log-probs "
                  "before the update: it needs algo.old_logp_source != 'update'")
  if a.distill_mode == "reward" and a.reward_aggregation == "normalize_then_sum":
    errors.append("algo.distill_mode='reward' has no place in GDPO's normalised rewards "
                  "(algo.reward_aggregation='normalize_then_sum'): use distill_mode='advantage'")
  if a.rsft_from_teacher and not a.rsft_every:
    errors.append("algo.rsft_from_teacher=True samples the RS-FT phases from the teacher: it "
                  "needs algo.rsft_every > 0")
  if a.rsft_from_teacher and c.parallel.sampler_devices:
    errors.append("algo.rsft_from_teacher=True samples with the teacher on the trainer's "
                  "devices: it needs parallel.sampler_devices=0")
  _check_teacher_source(errors, c)


def _check_teacher_source(errors, c):
  """The teacher's directory exists, or a recipe will train it there."""
  a = c.algo
  recipe = str(a.distill_teacher_recipe)
  if recipe:
    path = pathlib.Path(recipe.partition(":")[0])
    if path.suffix != ".py" or not path.is_file():
      errors.append(f"algo.distill_teacher_recipe={recipe!r} is not an experiment file "
                    "('experiments/NAME.py[:step]')")
    return
  where = pathlib.Path(distill_teacher_dir(c))
  if not (where / "config.json").is_file():
    errors.append(f"algo.distill_teacher={a.distill_teacher!r}: {str(where)!r} is neither an "
                  "rljax run directory (config.json + checkpoints/) nor a Hugging Face "
                  "directory (config.json + *.safetensors); set algo.distill_teacher_recipe "
                  "to train it first")


def check_eval_sets(errors, c):
  """Every `eval.sets` entry: its fields, its source, and the held-out set's keys."""
  sets, first = c.eval.sets, len(errors)
  if "heldout" not in sets:
    errors.append("eval.sets.heldout is missing: it is the run's held-out result "
                  "(heldout_* in result.json)")
  for name, entry in sets.items():
    where = f"eval.sets.{name}"
    if not hasattr(entry, "keys"):
      errors.append(f"{where}={entry!r} must be a group (rljax.train.config.eval_set(...))")
      continue
    unknown = sorted(set(entry.keys()) - set(EVAL_SET_FIELDS))
    if unknown:
      errors.append(f"{where} has unknown fields {unknown}; its fields: {list(EVAL_SET_FIELDS)}")
    if not _SET_NAME.fullmatch(name):
      errors.append(f"{where}: a set name is letters, digits, '_' or '-'")
  if len(errors) > first:
    return
  for name, f in resolved_eval_sets(c).items():
    _check_eval_set(errors, c, name, f)


def _check_eval_set(errors, c, name, f):
  where = f"eval.sets.{name}"
  _check_eval_source(errors, where, str(f["source"]))
  if not isinstance(f["size"], int) or isinstance(f["size"], bool) or f["size"] < 0:
    errors.append(f"{where}.size={f['size']!r} must be an int >= 0 (0: all of the source)")
  if not isinstance(f["k"], int) or isinstance(f["k"], bool) or f["k"] < 0:
    errors.append(f"{where}.k={f['k']!r} must be an int >= 0 (samples per prompt)")
  if not _is_number(f["temperature"]) or f["temperature"] <= 0:
    errors.append(f"{where}.temperature={f['temperature']!r} must be > 0")
  if not isinstance(f["greedy"], bool):
    errors.append(f"{where}.greedy={f['greedy']!r} must be true or false")
  elif not f["greedy"] and not f["k"]:
    errors.append(f"{where}: greedy=False and k=0 evaluate nothing")
  if name == "heldout":
    if f["source"] != "heldout" or f["greedy"] is not True:
      errors.append("eval.sets.heldout is the run's held-out result (heldout_acc_* in "
                    "result.json): it keeps source='heldout' and greedy=True")
    if isinstance(f["size"], int) and f["size"] > c.task.heldout_size:
      errors.append(f"eval.sets.heldout.size={f['size']} exceeds task.heldout_size="
                    f"{c.task.heldout_size}, the held-out split")


def _check_eval_source(errors, where, source):
  if source == "heldout":
    return
  if source.endswith(".jsonl"):
    if not pathlib.Path(source).is_file():
      errors.append(f"{where}.source={source!r}: no such JSONL file")
    return
  name, _, level = source.partition(":")
  if name not in TASKS or (level and not (level.isdigit() and int(level) >= 1)):
    errors.append(f"{where}.source={source!r} is not 'heldout', a synthetic task "
                  f"({sorted(TASKS)}) with an optional ':LEVEL' >= 1, or a .jsonl file")
