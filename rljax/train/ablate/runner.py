"""`rljax ablate`: every step of an experiment file over seeds, paired, and the verdicts.

The arms of one seed share the SFT start, the prompt order and the sampling keys (common
random numbers: `rljax.train.rollout.train_batches.iteration_keys`, `rljax.sampling.filters
.stream_uniforms`), and are evaluated on the same held-out prompts with the same sampling
noise, so each step is compared with the previous and with the first one seed by seed and
prompt by prompt (`rljax.analysis.effects`). Compiled programs are shared across the runs
through JAX's persistent compilation cache, and the evaluation of the start is shared by
every step of a seed (`rljax.train.run.heldout.evaluate_start`).
"""

from __future__ import annotations

import json
import pathlib
import time
import zlib

from rljax import analysis
from rljax.analysis.ablation_report import effects_report
from rljax.analysis.runs import load_batch, read_records
from rljax.train.ablate import report as report_lib
from rljax.train.ablate.compile_cache import CompileCounter, enable_persistent_cache
from rljax.train.ablate.finished import finished_runs
from rljax.train.ablate.outcomes import (
  expected_outcomes,
  prompt_ids,
  run_outcomes,
  start_diagnostics,
)
from rljax.train.ablate.table import summarize
from rljax.train.config import import_experiment, parse_override_value
from rljax.train.config.loading import module_config
from rljax.train.run.loop import train_validated
from rljax.train.run.metrics import provenance, read_provenance

# Evaluation with power, unless the experiment file (`ABLATION_DEFAULTS`) or `--set` says
# otherwise: 512 held-out prompts, avg@8 as the primary outcome, pass@64 on 128 of them.
ABLATION_DEFAULTS = {"task.heldout_size": 512, "sampling.eval_n": 8,
                     "sampling.eval_passk_n": 64, "sampling.eval_passk_prompts": 128,
                     "run.eval_every": 0, "run.plots": False, "run.tensorboard": False}
# Outcomes for which a decrease is the improvement ("better" then means lower).
LOWER_IS_BETTER = ("train/truncated_frac", "train/truncated_loss_tokens", "distill/reverse_kl",
                   "staleness/mean")


def parse_sets(items) -> dict:
  """["field=value", ...] -> {field: value} (`--set` of `rljax ablate`)."""
  out = {}
  for item in items:
    key, sep, value = item.partition("=")
    if not sep:
      raise ValueError(f"--set expects FIELD=VALUE, got {item!r}")
    out[key] = parse_override_value(value)
  return out


def split_label(step: str) -> tuple[str, int]:
  """"clip_higher@aa" -> ("clip_higher", its sample stream): a step listed again under a
  label runs the same config with its own sampling noise (an A/A control).

  Raises:
    ValueError: a label whose stream is 0 (`STEP@0`, `STEP@`): the unlabelled step's own
      stream, so the copy would replicate it exactly and no A/A control at all.
  """
  base, sep, label = step.partition("@")
  if not sep:
    return step, 0
  stream = int(label) if label.isdigit() else zlib.crc32(label.encode()) & 0x7FFFFFFF
  if stream == 0:
    raise ValueError(f"step {step!r}: label {label!r} names sample stream 0, the stream of "
                     f"{base!r} itself, so the copy would be an exact replica; use another "
                     f"label ({base}@aa)")
  return base, stream


def step_list(module, experiment, steps=None, *, aa=False) -> list:
  """The steps to run: `steps` or the file's `ABLATION_STEPS`, plus `FIRST@aa` with `aa`
  (an A/A copy of the first step). Each appears once and maps to its own sample stream.

  Raises:
    ValueError: no steps, a step twice, or a label on stream 0 (`split_label`).
  """
  steps = list(steps or getattr(module, "ABLATION_STEPS", None) or [])
  if not steps:
    raise ValueError(f"{experiment} defines no ABLATION_STEPS tuple")
  if aa:
    steps.append(f"{steps[0].partition('@')[0]}@aa")
  repeated = sorted({s for s in steps if steps.count(s) > 1})
  if repeated:
    raise ValueError(f"steps listed more than once: {repeated} (an A/A copy is STEP@LABEL; "
                     "--aa adds FIRST@aa)")
  streams = {}
  for step in steps:
    key = split_label(step)
    if key in streams:
      raise ValueError(f"steps {streams[key]!r} and {step!r} run the same config on the same "
                       "sample stream")
    streams[key] = step
  return steps


def plan(experiment, *, out_dir=None, overrides=(), seeds=None, steps=None, aa=False,
         module=None):
  """[(step, seed, config)] of every run, validated before anything runs (`step_list`).

  Args:
    module: the experiment file, imported (default: imported here, once).
  """
  path = pathlib.Path(experiment)
  module = module or import_experiment(path)
  steps = step_list(module, experiment, steps, aa=aa)
  out = pathlib.Path(out_dir or f"runs/ablate_{path.stem}")
  sets = {**ABLATION_DEFAULTS, **getattr(module, "ABLATION_DEFAULTS", {}),
          **parse_sets(overrides)}
  runs = []
  for seed in (seeds or [None]):
    for step in steps:
      base, stream = split_label(step)
      where = out / step if seed is None else out / step / f"seed{seed}"
      extra = {"run.dir": str(where), "run.sample_stream": stream}
      if seed is not None:
        extra["run.seed"] = seed
      runs.append((step, seed, module_config(module, base, {**sets, **extra}, path=path)))
  check_verdict_settings(module, runs[0][2])
  return runs


def check_verdict_settings(module, config) -> None:
  """The experiment file's `PRIMARY_OUTCOME` (an outcome its runs will have) and
  `EQUIVALENCE_MARGINS` ({outcome name or prefix: margin > 0}), checked before any run.

  Raises:
    ValueError: naming the setting and the allowed values.
  """
  outcomes = expected_outcomes(config, getattr(module, "MECHANISMS", {}).values())
  primary = getattr(module, "PRIMARY_OUTCOME", None)
  if primary is not None and primary not in outcomes:
    raise ValueError(f"PRIMARY_OUTCOME={primary!r} is not an outcome of these runs; "
                     f"outcomes: {outcomes}")
  margins = getattr(module, "EQUIVALENCE_MARGINS", None) or {}
  if not isinstance(margins, dict):
    raise ValueError(f"EQUIVALENCE_MARGINS must be a dict {{outcome or prefix: margin}}, got "
                     f"{type(margins).__name__}")
  for name, margin in margins.items():
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not margin > 0:
      raise ValueError(f"EQUIVALENCE_MARGINS[{name!r}]={margin!r}: a margin is a number > 0 in "
                       "the outcome's units (0.03 = 3 points of a fraction)")


def runs_provenance(run_dirs) -> dict:
  """{"commit", "jax", "cpu"} of the runs (their `provenance.json`; values that differ
  between runs joined by " | "; this process's where no run has one), and "report_commit",
  the code that built the report."""
  found = [p for p in map(read_provenance, run_dirs) if p]
  here = provenance()
  out = {key: " | ".join(sorted({p.get(key, "unknown") for p in found})) if found
         else here[key] for key in ("commit", "jax", "cpu")}
  return {**out, "report_commit": here["commit"]}


def run_ablation(experiment, *, out_dir=None, overrides=(), seeds=None, steps=None, aa=False,
                 report_only=False, module=None, runs=None):
  """Runs every step of `experiment` (its `ABLATION_STEPS`, or `steps`) for every seed;
  writes report.md, report.json, the forest plot and the curves; returns report.md's path.
  A run directory that holds the finished run of the same config is read, not trained
  again (`rljax.train.ablate.finished`): re-running over an output directory rebuilds the
  report.

  Args:
    seeds: run.seed values (None: the config's own seed, one run per step).
    steps: step names to run instead of `ABLATION_STEPS` ("STEP@LABEL": an A/A copy).
    aa: add an A/A copy of the first step (`FIRST@aa`).
    report_only: train nothing; every run must be finished.
    module: the experiment file, imported (default: imported here, once).
    runs: `plan(...)` of these arguments, made already (`rljax ablate` validates it first).
  """
  path = pathlib.Path(experiment)
  out = pathlib.Path(out_dir or f"runs/ablate_{path.stem}")
  module = module or import_experiment(path)
  runs = runs or plan(experiment, out_dir=out, overrides=overrides, seeds=seeds, steps=steps,
                      aa=aa, module=module)
  out.mkdir(parents=True, exist_ok=True)
  cache_dir = enable_persistent_cache(out / "jax_cache")
  counter = CompileCounter()
  mechanisms = dict(getattr(module, "MECHANISMS", {}))
  tracked = sorted(set(mechanisms.values()))
  t0 = time.perf_counter()
  done = finished_runs(runs, report_only=report_only)
  got = _run_all(runs, done, out, counter, tracked)
  report = effects_report(got["results"], seeds=list(seeds) if seeds else None,
                          lower_is_better=LOWER_IS_BETTER, prompt_ids=got["ids"],
                          primary_outcome=getattr(module, "PRIMARY_OUTCOME", None),
                          margins=getattr(module, "EQUIVALENCE_MARGINS", None))
  run_dirs, tables = got["run_dirs"], got["tables"]
  report.update(experiment=path.name, overrides={k: str(v) for k, v in parse_sets(
      overrides).items()}, mechanisms=mechanisms,
      starts={str(k): v for k, v in got["starts"].items()},
      **_timing(out, got["compiles"], cache_dir, time.perf_counter() - t0),
      runs_reused=sum(r is not None for r in done),
      runs_wall_s=round(sum(r["wall_s"] for rows in tables.values() for r in rows), 1),
      provenance=runs_provenance([d for dirs in run_dirs.values() for d in dirs]))
  first = next(iter(run_dirs))
  impact = analysis.impact_section(got["variants"], out, batch=load_batch(run_dirs[first][0]))
  return report_lib.write(out, report, tables, run_dirs, impact)


def _timing(out, compiles, cache_dir, seconds) -> dict:
  """{"compile", "wall_s"} of this call; when it trained nothing (a report rebuilt from
  finished runs), the compile counts and wall time of the report.json it replaces, whose
  runs these are, and this call's seconds as "rebuild_s"."""
  previous = pathlib.Path(out) / "report.json"
  if compiles or not previous.is_file():
    return {"compile": report_lib.compile_summary(compiles, cache_dir),
            "wall_s": round(seconds, 1)}
  old = json.loads(previous.read_text())
  return {"compile": old.get("compile", report_lib.compile_summary(compiles, cache_dir)),
          "wall_s": old.get("wall_s", round(seconds, 1)), "rebuild_s": round(seconds, 1)}


def _run_all(runs, done, out, counter, tracked) -> dict:
  """Trains every run without a finished result (`done[i]` None) and reads every run's
  outcomes, prompt ids, table cells and start; {"results", "ids", "tables", "run_dirs",
  "variants", "starts", "compiles"}, each keyed by step (starts: by seed)."""
  got = {key: {} for key in ("results", "ids", "tables", "run_dirs", "variants", "starts")}
  got["compiles"] = []
  for (step, seed, config), result in zip(runs, done):
    if result is None:
      before = counter.snapshot()
      result = train_validated(config)
      got["compiles"].append({"step": step, "seed": seed,
                              **counter.since(before, counter.snapshot())})
    run_dir = config.run.dir
    got["run_dirs"].setdefault(step, []).append(run_dir)
    got["results"].setdefault(step, []).append(run_outcomes(run_dir, tracked))
    got["ids"].setdefault(step, []).append(prompt_ids(run_dir))
    got["tables"].setdefault(step, []).append(summarize(result, read_records(run_dir)))
    got["variants"][step] = analysis.variant_from_config(config, name=step)
    got["starts"].setdefault(seed, start_diagnostics(run_dir))
    (out / "results.json").write_text(json.dumps(got["tables"], indent=2))
  return got
