"""Load run directories for the analysis notebook: metrics, ablation tables, batches.

A run directory holds `metrics.jsonl` (one JSON object per iteration) and, when finished,
`result.json`; an ablation directory (`runs/ablate_NAME/`) holds `report.md`,
`results.json` and one run directory per step. Nothing here imports `rljax.train`
(the trainer imports `rljax.analysis`, not the other way round).
"""

from __future__ import annotations

import json
import math
import pathlib
import types

import numpy as np

from rljax.analysis.loss_weights import variant_from_config
from rljax.analysis.passk import curve_from_record

# The curves the DAPO authors say to watch (arXiv:2503.14476 §4.3: reward,
# entropy, length) plus held-out accuracy, since training reward can rise while
# held-out accuracy does not.
WATCH_CURVES = (
    ("reward", "train/reward"), ("held-out accuracy", "eval/accuracy"),
    ("entropy", "update/entropy"), ("response length", "train/response_length_mean"),
)
# Token statistics (`token_statistics`), plotted when a run has them.
TOKEN_CURVES = (
    ("entropy p10 / p50 / p90", ("tokens/entropy_p10", "tokens/entropy_p50",
                                 "tokens/entropy_p90")),
    ("entropy by advantage sign", ("tokens/entropy_pos_adv", "tokens/entropy_neg_adv")),
    ("Cov(log π, A)", ("tokens/cov_logp_adv",)),
    ("upper clip: low- vs high-prob tokens", ("tokens/clip_high_lowprob_frac",
                                              "tokens/clip_high_highprob_frac",
                                              "update/clip_high_lowprob",
                                              "update/clip_high_highprob")),
)
BATCH_FILE = "analysis_batch.npz"


def _number(value):
  if isinstance(value, str):
    try:
      return float(value)  # "nan" / "inf" as written by the metric writer
    except ValueError:
      return None
  return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def read_records(run_dir):
  """All records of `run_dir/metrics.jsonl` (empty list if there is none)."""
  path = pathlib.Path(run_dir) / "metrics.jsonl"
  if not path.exists():
    return []
  return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def series(records, key):
  """(iterations, values) of `key`, skipping records without a numeric value."""
  points = [(r.get("iteration", i), _number(r.get(key))) for i, r in enumerate(records)]
  points = [(x, y) for x, y in points if y is not None and math.isfinite(y)]
  if not points:
    return np.zeros(0), np.zeros(0)
  xs, ys = zip(*points)
  return np.asarray(xs, np.float64), np.asarray(ys, np.float64)


def _is_run(path):
  return (path / "metrics.jsonl").exists()


def expand_run_dirs(spec):
  """{name: path} of run directories from a comma-separated string or a list of paths.

  An ablation directory (with `results.json`) or any directory of runs expands to its
  sub-directories that hold a `metrics.jsonl`, named "PARENT/STEP".
  """
  items = spec.split(",") if isinstance(spec, str) else list(spec)
  runs = {}
  for item in items:
    path = pathlib.Path(str(item).strip())
    if not str(item).strip() or not path.is_dir():
      continue
    if _is_run(path):
      runs[path.name] = path
    for child in sorted(p for p in path.iterdir() if p.is_dir() and _is_run(p)):
      runs[f"{path.name}/{child.name}"] = child
  return runs


def ablation_dirs(spec):
  """Directories among `spec` (comma-separated or list) that hold an ablation report."""
  items = spec.split(",") if isinstance(spec, str) else list(spec)
  paths = [pathlib.Path(str(i).strip()) for i in items if str(i).strip()]
  return [p for p in paths if (p / "results.json").exists() or (p / "report.md").exists()]


def ablation_table(ablation_dir):
  """Markdown table of an ablation: the one in `report.md`, else built from results.json."""
  ablation_dir = pathlib.Path(ablation_dir)
  report = ablation_dir / "report.md"
  if report.exists():
    rows = [line for line in report.read_text().splitlines() if line.startswith("|")]
    if rows:
      return "\n".join(rows)
  results = json.loads((ablation_dir / "results.json").read_text())
  columns = sorted({k for row in results.values() for k in row})
  lines = ["| step | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
  for step, row in results.items():
    cells = [f"{row[c]:.3f}" if isinstance(row.get(c), float) else str(row.get(c, ""))
             for c in columns]
    lines.append(f"| {step} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def pass_at_k_curve_of_run(run_dir):
  """The run's held-out pass@k curve: from result.json, else the last eval record."""
  run_dir = pathlib.Path(run_dir)
  result = run_dir / "result.json"
  if result.exists():
    curve = curve_from_record(json.loads(result.read_text()), prefix="heldout_")
    if curve.size:
      return curve
  for record in reversed(read_records(run_dir)):
    curve = curve_from_record(record, prefix="eval/")
    if curve.size:
      return curve
  return np.zeros(0)


def synthetic_batch(*, seed=0, batch=32, max_len=24, group=8):
  """A GRPO-like batch with the shapes of a rollout, for the trick-impact view.

  Groups of `group` completions with 0/1 scores and group-normalised advantages,
  lengths that grow with difficulty, token probabilities from a Beta mixture (mostly
  confident tokens plus a low-probability tail), entropy anti-correlated with
  probability, and a current policy one small update away from the old one (a proper
  distribution: p = 0.9 can rise to at most 1/0.9 ≈ 1.11 times, so it never reaches
  the upper clip, as in DAPO's clip-higher argument).
  """
  rng = np.random.default_rng(seed)
  lengths = rng.integers(max_len // 4, max_len + 1, batch)
  mask = (np.arange(max_len)[None] < lengths[:, None]).astype(np.float32)
  confident = rng.random((batch, max_len)) < 0.7
  p_old = np.where(confident, rng.beta(8, 1, (batch, max_len)), rng.beta(1, 6, (batch, max_len)))
  p_old = np.clip(p_old, 1e-3, 1.0 - 1e-6)
  entropy = np.clip(-np.log(p_old) + rng.normal(0, 0.3, p_old.shape), 0.0, None)
  scores = (rng.random(batch) < 0.6 - 0.3 * lengths / max_len).astype(np.float64)
  scores_g = scores.reshape(-1, group)
  adv = ((scores_g - scores_g.mean(-1, keepdims=True))
         / (scores_g.std(-1, ddof=1, keepdims=True) + 1e-6)).reshape(-1)
  old_logp = np.log(p_old)
  logp = np.minimum(old_logp + rng.normal(0.0, 0.15, p_old.shape) * mask, -1e-6)  # p <= 1
  return dict(logp=logp, old_logp=old_logp, entropy=entropy, advantages=adv, mask=mask,
              scores=scores, truncated=lengths >= max_len)


def load_batch(path):
  """A recorded batch with the keys of `synthetic_batch`: `path` is an .npz file or a run
  directory holding `analysis_batch.npz`; None if there is none."""
  path = pathlib.Path(path)
  path = path if path.suffix == ".npz" else path / BATCH_FILE
  if not path.is_file():
    return None
  with np.load(path) as data:
    return {k: data[k] for k in data.files}


def _namespace(value):
  if isinstance(value, dict):
    return types.SimpleNamespace(**{k: _namespace(v) for k, v in value.items()})
  return value


def variant_of_run(run_dir, *, name=None):
  """The LossVariant of a run, from the `config.json` the trainer writes; None if absent."""
  path = pathlib.Path(run_dir) / "config.json"
  if not path.exists():
    return None
  return variant_from_config(_namespace(json.loads(path.read_text())),
                             name=name or pathlib.Path(run_dir).name)


def ablation_variants(ablation_dir):
  """{step: LossVariant} of an ablation's step runs that have a config.json, in the order
  of results.json (else sorted)."""
  ablation_dir = pathlib.Path(ablation_dir)
  results = ablation_dir / "results.json"
  steps = (list(json.loads(results.read_text())) if results.exists()
           else sorted(p.name for p in ablation_dir.iterdir() if p.is_dir()))
  variants = {step: variant_of_run(ablation_dir / step) for step in steps}
  return {step: v for step, v in variants.items() if v is not None}
