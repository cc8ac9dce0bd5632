"""`rljax ablate`: every step of an experiment file over seeds, paired, and the verdicts.

The arms of one seed share the SFT start, the prompt order and the sampling keys (common
random numbers: `rljax.train.run.iteration.iteration_keys`, `rljax.sampling.filters
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
from rljax.train.ablate.outcomes import run_outcomes, start_diagnostics
from rljax.train.ablate.table import summarize
from rljax.train.config import import_experiment, load_config, parse_override_value
from rljax.train.run.loop import train

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
  label runs the same config with its own sampling noise (an A/A control)."""
  base, sep, label = step.partition("@")
  if not sep:
    return step, 0
  return base, int(label) if label.isdigit() else zlib.crc32(label.encode()) & 0x7FFFFFFF


def plan(experiment, *, out_dir=None, overrides=(), seeds=None, steps=None):
  """[(step, seed, config)] of every run, validated before anything runs."""
  path = pathlib.Path(experiment)
  module = import_experiment(path)
  steps = list(steps or getattr(module, "ABLATION_STEPS", None) or [])
  if not steps:
    raise ValueError(f"{experiment} defines no ABLATION_STEPS tuple")
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
      runs.append((step, seed, load_config(f"{experiment}:{base}", {**sets, **extra})))
  return runs


def run_ablation(experiment, *, out_dir=None, overrides=(), seeds=None, steps=None):
  """Runs every step of `experiment` (its `ABLATION_STEPS`, or `steps`) for every seed;
  writes report.md, report.json, the forest plot and the curves; returns report.md's path.

  Args:
    seeds: run.seed values (None: the config's own seed, one run per step).
    steps: step names to run instead of `ABLATION_STEPS` ("STEP@LABEL": an A/A copy).
  """
  path = pathlib.Path(experiment)
  out = pathlib.Path(out_dir or f"runs/ablate_{path.stem}")
  out.mkdir(parents=True, exist_ok=True)
  runs = plan(experiment, out_dir=out, overrides=overrides, seeds=seeds, steps=steps)
  cache_dir = enable_persistent_cache(out / "jax_cache")
  counter = CompileCounter()
  mechanisms = dict(getattr(import_experiment(path), "MECHANISMS", {}))
  tracked = sorted(set(mechanisms.values()))
  results, tables, run_dirs, variants, starts, compiles = {}, {}, {}, {}, {}, []
  t0 = time.perf_counter()
  for step, seed, config in runs:
    before = counter.snapshot()
    result = train(config)
    compiles.append({"step": step, "seed": seed, **counter.since(before, counter.snapshot())})
    run_dir = config.run.dir
    run_dirs.setdefault(step, []).append(run_dir)
    results.setdefault(step, []).append(run_outcomes(run_dir, tracked))
    tables.setdefault(step, []).append(summarize(result, read_records(run_dir)))
    variants[step] = analysis.variant_from_config(config, name=step)
    starts.setdefault(seed, start_diagnostics(run_dir))
    (out / "results.json").write_text(json.dumps(tables, indent=2))
  report = effects_report(results, seeds=list(seeds) if seeds else None,
                          lower_is_better=LOWER_IS_BETTER)
  report.update(experiment=path.name, overrides={k: str(v) for k, v in parse_sets(
      overrides).items()}, mechanisms=mechanisms, starts={str(k): v for k, v in starts.items()},
      compile=report_lib.compile_summary(compiles, cache_dir),
      wall_s=round(time.perf_counter() - t0, 1))
  first = next(iter(run_dirs))
  impact = analysis.impact_section(variants, out, batch=load_batch(run_dirs[first][0]))
  return report_lib.write(out, report, tables, run_dirs, impact)
