"""Batches in flight at a checkpoint: the batches an asynchronous run sampled ahead of the
trainer are written beside the step checkpoint, so a resumed run consumes exactly the
batches the uninterrupted one would have (they came from policy versions the checkpoint
no longer holds)."""

from __future__ import annotations

import json
import pathlib

import jax
import numpy as np

from rljax import parallel
from rljax.train.rollout.batch import ROW_FIELDS, SEQUENCE_FIELDS, RolloutBatch
from rljax.train.rollout.context import row_layout
from rljax.train.run.build import Run
from rljax.train.run.iteration import Sampled


def _path(run_dir, step) -> pathlib.Path:
  return pathlib.Path(run_dir) / "inflight" / f"{step}.npz"


def save_inflight(run_dir, step: int, sampled: list) -> None:
  """Writes the batches sampled ahead of step `step` (a collective: every process calls it;
  process 0 writes)."""
  arrays, meta = {}, []
  for i, s in enumerate(sampled):
    b = s.batch
    host = parallel.gather({k: getattr(b, k) for k in SEQUENCE_FIELDS})
    arrays.update({f"{i}/{k}": np.asarray(v) for k, v in host.items()})
    arrays.update({f"{i}/{k}": np.asarray(getattr(b, k)) for k in ROW_FIELDS})
    arrays.update({f"{i}/reward/{k}": np.asarray(v) for k, v in b.components.items()})
    arrays[f"{i}/versions"] = np.asarray(b.versions)
    if b.greedy_scores is not None:
      arrays[f"{i}/greedy_scores"] = np.asarray(b.greedy_scores)
    meta.append({"version": s.version, "prompts": [p.id for p in b.prompts],
                 "stats": {k: float(v) for k, v in s.stats.items()}, "seconds": b.seconds})
  if not parallel.is_primary():
    return
  path = _path(run_dir, step)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(f"{step}.tmp.npz")
  np.savez(tmp, meta=np.asarray(json.dumps(meta)), **arrays)
  tmp.rename(path)


def load_inflight(run: Run, run_dir, step: int) -> list:
  """The batches `save_inflight` wrote at step `step` ([] when there are none), placed as
  the rollout places its rows."""
  path = _path(run_dir, step)
  if not path.exists():
    return []
  with np.load(path) as data:
    arrays = {k: data[k] for k in data.files}
  prompts_of = {p.id: p for p in run.task.train_prompts()}
  out = []
  for i, m in enumerate(json.loads(str(arrays.pop("meta")))):
    rows = {k.split("/", 1)[1]: v for k, v in arrays.items() if k.startswith(f"{i}/")}
    sharding, _ = row_layout(run.ctx, len(rows["scores"]))
    for k in SEQUENCE_FIELDS:
      rows[k] = jax.device_put(rows[k], sharding)
    greedy, versions = rows.pop("greedy_scores", None), rows.pop("versions")
    batch = RolloutBatch.from_rows(rows, [prompts_of[pid] for pid in m["prompts"]])
    batch.greedy_scores, batch.seconds, batch.versions = greedy, m["seconds"], versions
    out.append(Sampled(batch, m["stats"], m["version"]))
  return out


def prune_inflight(run_dir, keep_steps) -> None:
  """Deletes in-flight files of checkpoints that no longer exist."""
  folder = pathlib.Path(run_dir) / "inflight"
  if not folder.exists() or not parallel.is_primary():
    return
  for f in folder.glob("*.npz"):
    if f.stem.isdigit() and int(f.stem) not in set(keep_steps):
      f.unlink()
