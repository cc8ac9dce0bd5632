"""Metric writers (JSONL + TensorBoard) and the end-of-run PNG plots."""

from __future__ import annotations

import json
import math
import pathlib

import numpy as np

# The curves the DAPO authors say to watch (seed 004: reward, entropy, length) plus
# accuracy and the health signals of an update.
PLOTTED = (
    ("reward", "train/reward"), ("accuracy (train)", "train/accuracy"),
    ("accuracy (held-out)", "eval/accuracy"), ("entropy", "update/entropy"),
    ("response length", "train/response_length_mean"), ("clip fraction (high)", "update/clip_high"),
    ("approx KL to old", "update/approx_kl_old"), ("grad norm", "update/grad_norm"),
)


def _to_python(value):
  if isinstance(value, (np.generic, np.ndarray)):
    value = value.item() if np.ndim(value) == 0 else value.tolist()
  if hasattr(value, "item") and not isinstance(value, (list, dict)):
    try:
      value = value.item()
    except (TypeError, ValueError):
      pass
  if isinstance(value, float) and not math.isfinite(value):
    return str(value)
  return value


class MetricWriter:
  """Appends one JSON object per iteration to `metrics.jsonl`, mirrors scalars to TensorBoard.

  With `enabled=False` (every process but the first of a multi-process run) it writes
  nothing.
  """

  def __init__(self, run_dir, *, tensorboard=True, enabled=True):
    self.run_dir = pathlib.Path(run_dir)
    self.path = self.run_dir / "metrics.jsonl"
    self.enabled = enabled
    self._tb = None
    if not enabled:
      return
    self.run_dir.mkdir(parents=True, exist_ok=True)
    if tensorboard:
      from tensorboardX import SummaryWriter
      self._tb = SummaryWriter(str(self.run_dir / "tensorboard"))

  def truncate_after(self, iteration):
    """Drops records beyond `iteration` (a resumed run rewrites them identically)."""
    if not self.enabled or not self.path.exists():
      return
    kept = [line for line in self.path.read_text().splitlines()
            if line and json.loads(line).get("iteration", 0) <= iteration]
    self.path.write_text("".join(line + "\n" for line in kept))

  def write(self, iteration, metrics):
    if not self.enabled:
      return
    record = {"iteration": int(iteration)}
    record.update({k: _to_python(v) for k, v in sorted(metrics.items())})
    with self.path.open("a") as f:
      f.write(json.dumps(record) + "\n")
    if self._tb is not None:
      for key, value in record.items():
        if isinstance(value, (int, float)) and key != "iteration":
          self._tb.add_scalar(key, value, iteration)
      self._tb.flush()

  def close(self):
    if self._tb is not None:
      self._tb.close()


def read_metrics(run_dir):
  """All records of a run's metrics.jsonl as a list of dicts."""
  path = pathlib.Path(run_dir) / "metrics.jsonl"
  if not path.exists():
    return []
  return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plot_run(run_dir, out_path=None):
  """Writes a grid of the key curves of one run as PNG; returns the path."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  records = read_metrics(run_dir)
  out_path = pathlib.Path(out_path or pathlib.Path(run_dir) / "curves.png")
  fig, axes = plt.subplots(2, 4, figsize=(16, 7))
  for ax, (title, key) in zip(axes.ravel(), PLOTTED):
    points = [(r["iteration"], r[key]) for r in records if isinstance(r.get(key), (int, float))]
    if points:
      xs, ys = zip(*points)
      ax.plot(xs, ys, marker="." if len(xs) < 30 else None)
    ax.set_title(title)
    ax.set_xlabel("iteration")
    ax.grid(alpha=0.3)
  fig.tight_layout()
  fig.savefig(out_path, dpi=80)
  plt.close(fig)
  return out_path
