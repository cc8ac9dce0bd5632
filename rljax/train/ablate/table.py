"""The descriptive table of an ablation: each step's outcomes and mechanism metrics as mean ±
sd over seeds, and the overlay curves (mean ± band over seeds)."""

from __future__ import annotations

import json
import math
import pathlib
import re

import numpy as np

from rljax.analysis import entropy_law
from rljax.analysis.plots import pyplot, save_figure
from rljax.analysis.runs import read_records

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
  k = max((int(m.group(1)) for m in map(re.compile(r"heldout_avg@(\d+)$").match, result) if m),
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


def _result(run_dir):
  """The run's result.json as a dict ({} when it has none)."""
  path = pathlib.Path(run_dir) / "result.json"
  return json.loads(path.read_text()) if path.exists() else {}


def _curve_points(records, result, key):
  """{iteration: value} of `key` in one run; held-out accuracy also gets the evaluations
  before (iteration 0) and after RL."""
  points = {r["iteration"]: r[key] for r in records if isinstance(r.get(key), (int, float))}
  if key == "eval/accuracy" and result:
    points[0] = result["heldout_acc_before"]
    points[max((r["iteration"] for r in records), default=0)] = result["heldout_acc_after"]
  return points


def overlay_plot(run_dirs, out_path):
  """Accuracy, held-out accuracy, entropy, length and truncation of every step: the mean
  over that step's seeds with a band of ± one standard deviation (the analogues of DAPO's
  Figs. 2-5, arXiv:2503.14476).

  run_dirs: {step: run dir or [run dir per seed]}.
  """
  plt = pyplot()
  fig, axes = plt.subplots(1, len(_CURVES), figsize=(4 * len(_CURVES), 3.6))
  for name, dirs in run_dirs.items():
    dirs = [dirs] if isinstance(dirs, (str, pathlib.Path)) else dirs
    records = [read_records(d) for d in dirs]
    results = [_result(d) for d in dirs]
    for ax, (_, key) in zip(axes, _CURVES):
      per_seed = [_curve_points(recs, res, key) for recs, res in zip(records, results)]
      its = sorted(set.intersection(*(set(p) for p in per_seed))) if per_seed else []
      if not its:
        continue
      values = np.asarray([[p[i] for p in per_seed] for i in its], np.float64)
      mean, sd = values.mean(axis=1), values.std(axis=1)
      line, = ax.plot(its, mean, label=name)
      if values.shape[1] > 1:
        ax.fill_between(its, mean - sd, mean + sd, color=line.get_color(), alpha=0.15)
  for ax, (title, _) in zip(axes, _CURVES):
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("iteration")
    ax.grid(alpha=0.3)
  axes[0].legend(fontsize=7)
  fig.tight_layout()
  return save_figure(fig, out_path, plt)
