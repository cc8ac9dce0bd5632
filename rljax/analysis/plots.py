"""PNG plots of the analysis views: trick impact and pass@k curves (matplotlib, Agg)."""

from __future__ import annotations

import pathlib

import numpy as np

from rljax.analysis.runs import series


def pyplot():
  """matplotlib.pyplot with the non-interactive Agg backend (files only, no display)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  return plt


def _heatmap(ax, grid, report, title, vmax):
  image = ax.imshow(grid, cmap="RdBu", vmin=-vmax, vmax=vmax, aspect="auto")
  ax.set_xticks(range(len(report.entropy_labels)), report.entropy_labels, fontsize=7)
  ax.set_yticks(range(len(report.prob_labels)), report.prob_labels, fontsize=7)
  ax.set_xlabel("token entropy bucket")
  ax.set_ylabel("p_old bucket")
  ax.set_title(title, fontsize=9)
  for (i, j), value in np.ndenumerate(grid):
    ax.text(j, i, f"{value:+.1f}", ha="center", va="center", fontsize=7)
  return image


def _bars(ax, buckets, scale, title):
  x = np.arange(len(buckets.labels))
  share = 100.0 * buckets.delta_abs / scale if scale > 0 else buckets.delta_abs
  ax.bar(x, share, color=np.where(share >= 0, "tab:blue", "tab:red"))
  ax.axhline(0.0, color="black", lw=0.8)
  ax.set_xticks(x, buckets.labels, fontsize=7, rotation=30)
  ax.set_xlabel(buckets.by)
  ax.set_ylabel("Δ Σ|w| (% of Σ|w_base|)")
  ax.set_title(title, fontsize=9)


def plot_impact(report, out_path):
  """Writes one PNG: Δw heatmaps (p_old × entropy) for A > 0 and A < 0, and bar charts of
  the change of each length / score bucket's total |w|; returns the path.

  Cells are ΔΣw in % of Σ|w_base|; blue = promoted (pushed up more / down less), red =
  suppressed relative to the baseline.
  """
  plt = pyplot()
  scale = report.total_abs_base if report.total_abs_base > 0 else 1.0
  grids = 100.0 * report.token_delta_sum / scale
  vmax = max(float(np.abs(grids).max()), 1e-6)
  fig, axes = plt.subplots(1, 4, figsize=(19, 4.4), layout="constrained")
  image = None
  for s, sign in enumerate(("A>0", "A<0")):
    image = _heatmap(axes[s], grids[s], report, f"ΔΣw, {sign} tokens (% of Σ|w_base|)", vmax)
  fig.colorbar(image, ax=axes[:2], shrink=0.8)
  _bars(axes[2], report.lengths, report.total_abs_base, "sequences by length")
  _bars(axes[3], report.scores, report.total_abs_base, "sequences by score")
  fig.suptitle(f"{report.trick_name} vs {report.base_name}: effective gradient weight change")
  return save_figure(fig, out_path, plt)


def plot_pass_at_k(curves, out_path, *, title="pass@k (unbiased)"):
  """Writes pass@k against k (log-scale x) for one or several runs; returns the path.

  Args:
    curves: {run name: float [k_max]} (entry k − 1 is pass@k), e.g. `pass_at_k_curve`.
    out_path: PNG path.
  """
  plt = pyplot()
  fig, ax = plt.subplots(figsize=(6, 4))
  for name, curve in curves.items():
    curve = np.asarray(curve)
    if curve.size:
      ax.plot(np.arange(1, curve.size + 1), curve, marker="o", ms=3, label=name)
  ax.set_xscale("log", base=2)
  ax.set_xlabel("k")
  ax.set_ylabel("pass@k")
  ax.set_ylim(0.0, 1.02)
  ax.grid(alpha=0.3)
  ax.set_title(title)
  if curves:
    ax.legend(fontsize=7)
  fig.tight_layout()
  return save_figure(fig, out_path, plt)


def save_figure(fig, out_path, plt):
  """Writes `fig` to `out_path` (PNG), closes it, returns the path."""
  out_path = pathlib.Path(out_path)
  out_path.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(out_path, dpi=80)
  plt.close(fig)
  return out_path


def plot_curves(records_by_run, out_path, curves):
  """Writes one panel per curve, every run overlaid; returns the path.

  Args:
    records_by_run: {run name: list of metric records (dicts with "iteration")}.
    out_path: PNG path.
    curves: ((title, key or tuple of keys), ...), e.g. `runs.WATCH_CURVES`. Several keys
      in one panel are drawn with different line styles.
  """
  plt = pyplot()
  fig, axes = plt.subplots(1, len(curves), figsize=(4.5 * len(curves), 3.6), squeeze=False,
                           layout="constrained")
  styles = ("-", "--", ":", "-.")
  for ax, (title, keys) in zip(axes[0], curves):
    keys = (keys,) if isinstance(keys, str) else tuple(keys)
    for color, (name, records) in zip(plt.rcParams["axes.prop_cycle"].by_key()["color"] * 9,
                                      records_by_run.items()):
      for style, key in zip(styles * 4, keys):
        xs, ys = series(records, key)
        if xs.size:
          label = name if len(keys) == 1 else f"{name}: {key.split('/')[-1]}"
          ax.plot(xs, ys, style, color=color, marker="." if xs.size < 30 else None, label=label)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("iteration")
    ax.grid(alpha=0.3)
    if ax.lines:
      ax.legend(fontsize=6)
  return save_figure(fig, out_path, plt)


def plot_ablation(results, out_path, *, keys=("heldout_acc_before", "heldout_acc_after")):
  """Grouped bars of held-out accuracy (before / after) per ablation step; returns the path.

  Args:
    results: the ablation's results.json as a dict {step: {key: value}}.
    out_path: PNG path.
    keys: which values to draw side by side.
  """
  plt = pyplot()
  steps = list(results)
  fig, ax = plt.subplots(figsize=(max(4.0, 1.3 * len(steps) + 2), 3.6), layout="constrained")
  width = 0.8 / len(keys)
  for i, key in enumerate(keys):
    values = [float(results[s].get(key, np.nan)) for s in steps]
    ax.bar(np.arange(len(steps)) + (i - (len(keys) - 1) / 2) * width, values, width, label=key)
  ax.set_xticks(range(len(steps)), steps, rotation=20, fontsize=8)
  ax.set_ylabel("held-out accuracy")
  ax.grid(alpha=0.3, axis="y")
  ax.legend(fontsize=7)
  return save_figure(fig, out_path, plt)
