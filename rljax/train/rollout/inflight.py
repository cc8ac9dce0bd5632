"""The batch source of an asynchronous run (`AsyncSource`: the sampler thread of
`rljax.train.rollout.async_rollouts`, up to k = `sampling.max_staleness` versions ahead) and
its batches in flight at a checkpoint: the batches it sampled ahead of the
trainer are written beside the step checkpoint, so a resumed run consumes exactly the
batches the uninterrupted one would have (they came from policy versions the checkpoint
no longer holds). With partial rollouts the batch being sampled is written too (its
prompts and the rows of the segments done, `rljax.train.rollout.partial`) and the
sampler's older versions that its later segments and the next batches still need."""

from __future__ import annotations

import json
import pathlib

import jax
import numpy as np
from flax import nnx

from rljax import parallel
from rljax.train.rollout.async_rollouts import AsyncRollouts, InFlight
from rljax.train.rollout.batch import ROW_FIELDS, SEQUENCE_FIELDS, RolloutBatch
from rljax.train.rollout.context import row_layout
from rljax.train.rollout.partial import PartialRows
from rljax.train.rollout.train_batches import Sampled, TrainBatches


def _path(run_dir, step) -> pathlib.Path:
  return pathlib.Path(run_dir) / "inflight" / f"{step}.npz"


_PARTIAL_FIELDS = ("tokens", "mask", "logp", "active")


def save_inflight(run_dir, step: int, inflight: InFlight) -> None:
  """Writes what the sampler holds at step `step` (a collective: every process calls it;
  process 0 writes)."""
  arrays, meta = {}, []
  for i, s in enumerate(inflight.batches):
    b = s.batch
    host = parallel.gather(b.sequence_arrays())
    arrays.update({f"{i}/{k}": np.asarray(v) for k, v in host.items()})
    arrays.update({f"{i}/{k}": np.asarray(getattr(b, k)) for k in ROW_FIELDS})
    arrays.update({f"{i}/reward/{k}": np.asarray(v) for k, v in b.components.items()})
    arrays[f"{i}/versions"] = np.asarray(b.versions)
    if b.greedy_scores is not None:
      arrays[f"{i}/greedy_scores"] = np.asarray(b.greedy_scores)
    meta.append({"version": s.version, "prompts": [p.id for p in b.prompts],
                 "stats": {k: float(v) for k, v in s.stats.items()}, "seconds": b.seconds})
  for version, model in inflight.models.items():
    leaves = parallel.gather(jax.tree.leaves(nnx.state(model)))
    arrays.update({f"model{version}/{i}": np.asarray(x) for i, x in enumerate(leaves)})
  if inflight.partial is not None:
    prompts, rows = inflight.partial
    host = parallel.gather({k: getattr(rows, k) for k in _PARTIAL_FIELDS})
    arrays.update({f"partial/{k}": np.asarray(v) for k, v in host.items()})
    arrays["partial/meta"] = np.asarray(json.dumps(
        {"prompts": [p.id for p in prompts], "segment": rows.segment}))
  if not parallel.is_primary():
    return
  path = _path(run_dir, step)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(f"{step}.tmp.npz")
  np.savez(tmp, meta=np.asarray(json.dumps(meta)), **arrays)
  tmp.rename(path)


def load_inflight(rollouts, run_dir, step: int, model) -> InFlight:
  """What `save_inflight` wrote at step `step` (nothing: an empty `InFlight`): batches placed
  as `rollouts` places its rows (their prompts: its task's train prompts), older versions as
  `model` (the sampler's model of step `step`) is placed."""
  path = _path(run_dir, step)
  if not path.exists():
    return InFlight([])
  with np.load(path) as data:
    arrays = {k: data[k] for k in data.files}
  prompts_of = {p.id: p for p in rollouts.ctx.task.train_prompts()}
  partial = None
  if "partial/meta" in arrays:
    m = json.loads(str(arrays.pop("partial/meta")))
    rows = PartialRows(*(arrays.pop(f"partial/{k}") for k in _PARTIAL_FIELDS),
                       segment=m["segment"])
    partial = ([prompts_of[pid] for pid in m["prompts"]], rows)
  models = _load_models(arrays, model)
  out = []
  for i, m in enumerate(json.loads(str(arrays.pop("meta")))):
    rows = {k.split("/", 1)[1]: v for k, v in arrays.items() if k.startswith(f"{i}/")}
    sharding, _ = row_layout(rollouts.ctx, len(rows["scores"]))
    for k in SEQUENCE_FIELDS + ("routes",) * ("routes" in rows):
      rows[k] = jax.device_put(rows[k], sharding)
    greedy, versions = rows.pop("greedy_scores", None), rows.pop("versions")
    batch = RolloutBatch.from_rows(rows, [prompts_of[pid] for pid in m["prompts"]])
    batch.greedy_scores, batch.seconds, batch.versions = greedy, m["seconds"], versions
    out.append(Sampled(batch, m["stats"], m["version"]))
  return InFlight(out, partial, models)


def _load_models(arrays: dict, like) -> dict:
  """{version: model} of the `model{version}/{leaf}` arrays (popped), placed as `like`."""
  graphdef, state = nnx.split(like)
  leaves, treedef = jax.tree.flatten(state)
  versions = sorted({int(k.split("/")[0][5:]) for k in arrays if k.startswith("model")})
  models = {}
  for v in versions:
    saved = [arrays.pop(f"model{v}/{i}") for i in range(len(leaves))]
    placed = [jax.device_put(x, leaf.sharding) for x, leaf in zip(saved, leaves)]
    models[v] = nnx.merge(graphdef, jax.tree.unflatten(treedef, placed))
  return models


def prune_inflight(run_dir, keep_steps) -> None:
  """Deletes in-flight files of checkpoints that no longer exist."""
  folder = pathlib.Path(run_dir) / "inflight"
  if not folder.exists() or not parallel.is_primary():
    return
  for f in folder.glob("*.npz"):
    if f.stem.isdigit() and int(f.stem) not in set(keep_steps):
      f.unlink()


class AsyncSource:
  """Batch t from the sampler thread, sampled by policy version max(0, t − k); the
  trainer's state is handed over to it after each update (and after a checkpoint). It
  answers the calls of `rljax.train.rollout.train_batches.SyncSource`."""

  def __init__(self, batches: TrainBatches, sampler_model, state, run_dir, step):
    model, self.sync = sampler_model(state, keep=True)
    restored = load_inflight(batches.rollouts, run_dir, step, model) if step else None
    self.worker = AsyncRollouts(batches, state, model, restored=restored)
    self.sampler_model, self.model = sampler_model, None

  def take(self, state, it) -> Sampled:
    sampled = self.worker.take(it)
    sampled.stats.update(self.sync)
    return sampled

  def updated(self, state) -> None:
    """Moves the new policy to the sampler's devices (published after the checkpoint)."""
    self.model, self.sync = self.sampler_model(state, keep=True)

  def publish(self, version: int) -> None:
    self.worker.publish(version, self.model)

  def checkpoint(self, run_dir, step: int) -> None:
    """Writes the batches sampled ahead of `step` beside its checkpoint."""
    save_inflight(run_dir, step, self.worker.in_flight(step))

  def prune(self, run_dir, keep_steps) -> None:
    """Deletes the in-flight files of checkpoints that no longer exist (`prune_inflight`)."""
    prune_inflight(run_dir, keep_steps)

  def close(self) -> None:
    self.worker.close()
