"""Finished runs an ablation reuses: a run directory that already holds the result of the
run the ablation plans (the same config, every iteration done) is read, not trained again,
so re-running `rljax ablate` over its output directory only rebuilds the report."""

from __future__ import annotations

import json
import pathlib

from rljax.train.run.heldout import PER_PROMPT_FILE

# Fields that name where a run is, not what it computes.
_WHERE = ("run.dir",)


def _flat(tree: dict) -> dict:
  """{"group.field": value} of a config's JSON (values that are dicts stay whole)."""
  return {f"{group}.{name}": value for group, fields in tree.items() if isinstance(fields, dict)
          for name, value in fields.items()}


def config_differences(saved: dict, planned: dict) -> list[str]:
  """Fields of both configs whose values differ, "run.dir" aside. A field only one of them
  has (added to or removed from rljax since the run) is not a difference.

  Args:
    saved, planned: configs as JSON trees ({group: {field: value}}).
  Returns:
    sorted "group.field" names.
  """
  a, b = _flat(saved), _flat(planned)
  return sorted(k for k in a.keys() & b.keys() if k not in _WHERE and a[k] != b[k])


def finished_result(run_dir, config):
  """The RESULT dict of the finished run in `run_dir`, or None when it has not finished.

  Finished: `result.json` and the per-prompt evaluation exist, `result.json` was written
  after `config.json` (a run restarted after it finished rewrites `config.json`), and it
  counts `config.run.iterations` iterations.

  Args:
    run_dir: the run directory the ablation gives this run.
    config: the validated config the ablation would run there.
  Raises:
    ValueError: the directory holds a finished run of another config (naming the fields):
      reusing it would mislabel it, training over it would destroy it.
  """
  run_dir = pathlib.Path(run_dir)
  result_path, config_path = run_dir / "result.json", run_dir / "config.json"
  if not (result_path.is_file() and config_path.is_file()
          and (run_dir / PER_PROMPT_FILE).is_file()):
    return None
  if result_path.stat().st_mtime < config_path.stat().st_mtime:
    return None
  saved = json.loads(config_path.read_text())
  planned = json.loads(config.to_json_best_effort(indent=2, sort_keys=True))
  differences = config_differences(saved, planned)
  if differences:
    raise ValueError(f"{run_dir} holds a finished run of another config (fields "
                     f"{', '.join(differences)}); remove it or choose another --out")
  result = json.loads(result_path.read_text())
  if result.get("iterations") != config.run.iterations:
    return None
  return result


def finished_runs(runs, *, report_only=False) -> list:
  """`finished_result` of every planned run ([(step, seed, config)]), checked before
  anything trains.

  Raises:
    ValueError: a directory holds a finished run of another config, or with `report_only`
      some runs have not finished (naming them).
  """
  results = [finished_result(config.run.dir, config) for _, _, config in runs]
  missing = [config.run.dir for (_, _, config), r in zip(runs, results) if r is None]
  if report_only and missing:
    raise ValueError(f"--report-only: {len(missing)} of {len(runs)} runs have not finished: "
                     f"{', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}")
  return results
