"""Ablation runner: every step of an experiment file, same seeds, one Markdown table + plots."""

from __future__ import annotations

import json
import math
import pathlib
import re

from rljax import analysis
from rljax.analysis import entropy_law
from rljax.analysis.runs import load_batch, read_records
from rljax.train.config import import_experiment, load_config, parse_override_value
from rljax.train.run.loop import train

# (column title, summary key): what the table reports for every step, mean ± spread over seeds.
# Beside the outcome, the metric the DAPO paper (arXiv:2503.14476) names for each step:
# clip-higher -> upper clip fraction and entropy (Fig. 2); overlong filtering / soft
# punishment -> truncation rate, length tail and loss tokens of truncated samples (Fig. 5);
# token-level loss -> length of incorrect vs correct samples (Fig. 4); dynamic sampling ->
# zero-variance groups, effective batch and generation rounds (Fig. 3b).
TABLE_COLUMNS = (
    ("held-out acc before", "heldout_acc_before"), ("held-out acc after", "heldout_acc_after"),
    ("avg@k", "avg"), ("pass@k", "pass"), ("OOD acc before / after", "ood"),
    ("entropy (last)", "entropy"),
    ("upper clip frac", "clip_high"), ("up-clipped with p_old < 0.5", "clip_high_lowprob"),
    ("truncated frac", "truncated"),
    ("length p90 (last)", "length_p90"), ("length correct / incorrect (last)", "length_ci"),
    ("truncated loss tokens", "truncated_loss_tokens"),
    ("zero-var groups", "zero_variance"), ("effective batch", "effective_batch"),
    ("gen rounds", "generation_rounds"), ("entropy law: predicted / actual final acc", "law"),
    ("wall s", "wall_s"),
)
_LAST = 5   # "(last)" columns average the last iterations, not one noisy iteration


def _parse_sets(items):
  out = {}
  for item in items:
    key, sep, value = item.partition("=")
    if not sep:
      raise ValueError(f"--set expects FIELD=VALUE, got {item!r}")
    out[key] = parse_override_value(value)
  return out


def _mean_of(records, key, last=None):
  vals = [r[key] for r in records if isinstance(r.get(key), (int, float)) and
          math.isfinite(r[key])]
  vals = vals[-last:] if last else vals
  return sum(vals) / len(vals) if vals else float("nan")


def _share(records, part_key, whole_key):
  """sum(part) / sum(whole) over iterations (NaN when the whole is 0 throughout)."""
  pairs = [(r[part_key], r[whole_key]) for r in records
           if isinstance(r.get(part_key), (int, float)) and isinstance(r.get(whole_key), (int, float))]
  whole = sum(w for _, w in pairs)
  return sum(p for p, _ in pairs) / whole if whole > 0 else float("nan")


def summarize(result, records):
  """One run's table cells from its RESULT dict and metric records."""
  k = max((int(m.group(1)) for m in map(re.compile(r"heldout_pass@(\d+)$").match, result) if m),
          default=0)
  law = entropy_law.fit_run(records)
  return {
      "heldout_acc_before": result["heldout_acc_before"],
      "heldout_acc_after": result["heldout_acc_after"],
      "avg": result.get(f"heldout_avg@{k}", float("nan")),
      "pass": result.get(f"heldout_pass@{k}", float("nan")),
      "ood": (result.get("heldout_ood_accuracy_before", float("nan")),
              result.get("heldout_ood_accuracy", float("nan"))),
      "entropy": _mean_of(records, "update/entropy", _LAST),
      "clip_high": _mean_of(records, "update/clip_high"),
      # DAPO Fig. 3a: the tokens the upper clip stops are the unlikely ones
      "clip_high_lowprob": _share(records, "update/clip_high_lowprob", "update/clip_high"),
      "truncated": _mean_of(records, "train/truncated_frac"),
      "length_p90": _mean_of(records, "train/response_length_p90", _LAST),
      "length_ci": (_mean_of(records, "train/length_correct", _LAST),
                    _mean_of(records, "train/length_incorrect", _LAST)),
      "truncated_loss_tokens": _mean_of(records, "train/truncated_loss_tokens"),
      "zero_variance": _mean_of(records, "train/zero_variance_group_frac"),
      "effective_batch": _mean_of(records, "train/effective_batch"),
      "generation_rounds": _mean_of(records, "train/generation_rounds"),
      "law": ((law.predicted_final, law.actual_final) if law is not None
              else (float("nan"), float("nan"))),
      "wall_s": result["wall_s"], "k": k,
  }


def _spread(values):
  """'mean ± sd' over seeds ('mean' for one seed); tuples cell-wise, joined by ' / '."""
  if isinstance(values[0], tuple):
    return " / ".join(_spread([v[i] for v in values]) for i in range(len(values[0])))
  finite = [v for v in values if math.isfinite(v)]
  if not finite:
    return "–"
  mean = sum(finite) / len(finite)
  if len(finite) == 1:
    return f"{mean:.3g}"
  sd = math.sqrt(sum((v - mean) ** 2 for v in finite) / (len(finite) - 1))
  return f"{mean:.3g} ± {sd:.2g}"


def markdown_table(rows):
  """rows: {step: [summary per seed]} -> Markdown, each cell mean ± sd over seeds."""
  first = next(iter(rows.values()))
  k = first[0]["k"]
  header = ["step"] + [name.replace("@k", f"@{k}") for name, _ in TABLE_COLUMNS]
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  for step, runs in rows.items():
    cells = [step] + [_spread([r[key] for r in runs]) for _, key in TABLE_COLUMNS]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


_CURVES = (("train accuracy", "train/accuracy"), ("held-out accuracy (greedy)", "eval/accuracy"),
           ("entropy", "update/entropy"), ("response length", "train/response_length_mean"),
           ("truncated fraction", "train/truncated_frac"))


def overlay_plot(run_dirs, out_path):
  """Accuracy, held-out accuracy, entropy, length and truncation of every step, each the
  mean over that step's seeds (the analogues of DAPO's Figs. 2-5).

  run_dirs: {step: run dir or [run dir per seed]}.
  """
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  import numpy as np

  fig, axes = plt.subplots(1, len(_CURVES), figsize=(4 * len(_CURVES), 3.6))
  for name, dirs in run_dirs.items():
    dirs = [dirs] if isinstance(dirs, (str, pathlib.Path)) else dirs
    records = [read_records(d) for d in dirs]
    results = [_result(d) for d in dirs]
    for ax, (_, key) in zip(axes, _CURVES):
      per_seed = [dict((r["iteration"], r[key]) for r in recs
                       if isinstance(r.get(key), (int, float))) for recs in records]
      if key == "eval/accuracy":   # the evaluations before (iteration 0) and after RL
        for points, res, recs in zip(per_seed, results, records):
          if res:
            points[0] = res["heldout_acc_before"]
            points[max((r["iteration"] for r in recs), default=0)] = res["heldout_acc_after"]
      its = sorted(set.intersection(*(set(p) for p in per_seed))) if per_seed else []
      if its:
        ax.plot(its, [np.mean([p[i] for p in per_seed]) for i in its], label=name)
  for ax, (title, _) in zip(axes, _CURVES):
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("iteration")
    ax.grid(alpha=0.3)
  axes[0].legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(out_path, dpi=80)
  plt.close(fig)


def _result(run_dir):
  """The run's result.json as a dict ({} when it has none)."""
  path = pathlib.Path(run_dir) / "result.json"
  return json.loads(path.read_text()) if path.exists() else {}


def run_ablation(experiment, *, out_dir=None, overrides=(), seeds=None):
  """Runs every `ABLATION_STEPS` entry of `experiment` for every seed; returns the report
  path. Runs of one seed share the SFT warm start (its cache key has no algo fields).

  Args:
    seeds: run.seed values (None: the config's own seed, one run per step).
  """
  path = pathlib.Path(experiment)
  steps = getattr(import_experiment(path), "ABLATION_STEPS", None)
  if not steps:
    raise ValueError(f"{experiment} defines no ABLATION_STEPS tuple")
  out = pathlib.Path(out_dir or f"runs/ablate_{path.stem}")
  out.mkdir(parents=True, exist_ok=True)
  extra = _parse_sets(overrides)
  rows, run_dirs, variants = {}, {}, {}
  for seed in (seeds or [None]):
    for step in steps:
      where = out / step if seed is None else out / step / f"seed{seed}"
      sets = {**extra, "run.dir": str(where)}
      if seed is not None:
        sets["run.seed"] = seed
      config = load_config(f"{experiment}:{step}", sets)
      variants[step] = analysis.variant_from_config(config, name=step)
      result = train(config)
      run_dirs.setdefault(step, []).append(config.run.dir)
      rows.setdefault(step, []).append(summarize(result, read_records(config.run.dir)))
      (out / "results.json").write_text(json.dumps(rows, indent=2))
  overlay_plot(run_dirs, out / "curves.png")
  impact = analysis.impact_section(variants, out, batch=load_batch(run_dirs[steps[0]][0]))
  seeds_text = ", ".join(map(str, seeds)) if seeds else "the config's"
  report = out / "report.md"
  report.write_text(
      f"# Ablation: {path.name}\n\nSeeds: {seeds_text} (every step runs on each; cells are "
      f"mean ± sd over seeds). Overrides: {extra or 'none'}. Columns marked (last) average "
      f"the last {_LAST} iterations; the entropy law is R = -a exp(H) + b (Cui et al. 2025, "
      "arXiv:2505.22617) fitted on the first third of each run's train accuracy.\n\n"
      + markdown_table(rows) + "\n\n![curves](curves.png)\n\n"
      + impact + "\n\nOpen `notebooks/analysis.ipynb` with `RLJAX_RUNS=" + str(out)
      + "` for token statistics and pass@k curves of every step.\n")
  return report
