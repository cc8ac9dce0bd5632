"""What a run writes beside its checkpoints: the metric records (JSONL + TensorBoard), the
end-of-run PNG plots, and where its numbers come from (`provenance.json`: the rljax commit,
the JAX version and the CPU, so a report built from the runs later can name them)."""

from __future__ import annotations

import json
import math
import os
import pathlib
import platform
import subprocess

import jax
import numpy as np
from tqdm import tqdm

from rljax.analysis.runs import read_records

# The curves the DAPO authors say to watch (arXiv:2503.14476, Sec. 4: reward, entropy,
# length) plus
# accuracy and the health signals of an update. The held-out panel is drawn separately
# (greedy, avg@k and pass@k, with the points before and after RL).
PLOTTED = (
    ("reward", "train/reward"), ("accuracy (train)", "train/accuracy"),
    ("entropy", "update/entropy"), ("response length", "train/response_length_mean"),
    ("truncated fraction", "train/truncated_frac"), ("clip fraction (high)", "update/clip_high"),
    ("approx KL to old", "update/approx_kl_old"), ("grad norm", "update/grad_norm"),
    ("effective batch", "train/effective_batch"),
)
HELDOUT_TITLE = "held-out accuracy"


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


class Progress:
  """The tqdm bar of the RL iterations, showing reward, accuracy, entropy and length."""

  def __init__(self, total: int, start: int, *, enabled: bool):
    self._bar = None
    if enabled:
      self._bar = tqdm(total=total, initial=start, desc="RL")

  def update(self, metrics: dict) -> None:
    if self._bar is None:
      return
    self._bar.set_postfix(reward=f"{metrics['train/reward']:.2f}",
                          acc=f"{metrics['train/accuracy']:.2f}",
                          ent=f"{metrics['update/entropy']:.2f}",
                          len=f"{metrics['train/response_length_mean']:.1f}")
    self._bar.update(1)

  def close(self) -> None:
    if self._bar is not None:
      self._bar.close()


def _heldout_series(records, before, after, last_iteration):
  """{label: [(iteration, value)]}: greedy accuracy, avg@k and pass@k of the held-out set,
  from the periodic `eval/` records plus the evaluations before (iteration 0) and after RL."""
  k = max((int(key.split("@")[1]) for key in (after or {}) if key.startswith("avg@")), default=0)
  series = {"greedy": "accuracy", f"avg@{k}": f"avg@{k}", f"pass@{k}": f"pass@{k}"}
  out = {}
  for label, key in series.items():
    points = {r["iteration"]: r[f"eval/{key}"] for r in records
              if isinstance(r.get(f"eval/{key}"), (int, float))}
    if before and key in before:
      points[0] = before[key]
    if after and key in after:
      points[last_iteration] = after[key]
    if points:
      out[label] = sorted(points.items())
  return out


def plot_run(run_dir, out_path=None, *, before=None, after=None):
  """Writes a grid of the key curves of one run as PNG; returns the path.

  Args:
    before, after: the held-out evaluations before and after RL (`evaluate` dicts), drawn
      at iteration 0 and at the last iteration of the held-out panel.
  """
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  records = read_records(run_dir)
  out_path = pathlib.Path(out_path or pathlib.Path(run_dir) / "curves.png")
  fig, axes = plt.subplots(2, 5, figsize=(20, 7))
  axes = axes.ravel()
  last = max((r["iteration"] for r in records), default=0)
  for label, points in _heldout_series(records, before, after, last).items():
    axes[0].plot(*zip(*points), marker=".", label=label)
  axes[0].set_title(HELDOUT_TITLE)
  axes[0].legend(fontsize=8)
  for ax, (title, key) in zip(axes[1:], PLOTTED):
    points = [(r["iteration"], r[key]) for r in records if isinstance(r.get(key), (int, float))]
    if points:
      xs, ys = zip(*points)
      ax.plot(xs, ys, marker="." if len(xs) < 30 else None)
    ax.set_title(title)
  for ax in axes:
    ax.set_xlabel("iteration")
    ax.grid(alpha=0.3)
  fig.tight_layout()
  fig.savefig(out_path, dpi=80)
  plt.close(fig)
  return out_path


PROVENANCE_FILE = "provenance.json"
_PACKAGE = pathlib.Path(__file__).resolve().parents[2]   # the rljax package directory


def _git(*args) -> str:
  try:
    out = subprocess.run(["git", "-C", str(_PACKAGE), *args], capture_output=True, text=True,
                         timeout=10, check=True)
  except (OSError, subprocess.SubprocessError):
    return ""
  return out.stdout.strip()


def commit() -> str:
  """The rljax checkout's commit hash, "+dirty" when tracked files have uncommitted changes,
  or "unknown" outside a git checkout."""
  head = _git("rev-parse", "HEAD")
  if not head:
    return "unknown"
  return head + ("+dirty" if _git("status", "--porcelain", "--untracked-files=no") else "")


def cpu() -> str:
  """The CPU model name and the number of cores this process may use."""
  name = platform.processor() or platform.machine()
  try:
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
      if line.startswith("model name"):
        name = line.split(":", 1)[1].strip()
        break
  except OSError:
    pass
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  return f"{name}, {cores} cores"


def provenance() -> dict:
  """{"commit", "jax", "cpu"} of this process."""
  return {"commit": commit(), "jax": jax.__version__, "cpu": cpu()}


def write_provenance(run_dir) -> None:
  """Writes `provenance.json` in `run_dir`."""
  (pathlib.Path(run_dir) / PROVENANCE_FILE).write_text(json.dumps(provenance(), indent=2))


def read_provenance(run_dir) -> dict:
  """The run's `provenance.json` ({} for a run written before it existed)."""
  path = pathlib.Path(run_dir) / PROVENANCE_FILE
  return json.loads(path.read_text()) if path.is_file() else {}
