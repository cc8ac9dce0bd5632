"""Where an iteration's batch comes from: sampled now by the current policy (the
synchronous loop), or taken from the sampler thread that runs up to k versions ahead
(`sampling.max_staleness` = k, `rljax.train.rollout.async_rollouts`). Either way the
sampler's model lives on the sampler's devices (`parallel.sampler_devices`): `sampler_model(
state, keep=False) -> (model, sync metrics)` puts the state's policy there
(`rljax.train.params.Params.sampler_model`)."""

from __future__ import annotations

from rljax.train.rollout.async_rollouts import AsyncRollouts
from rljax.train.rollout.inflight import load_inflight, save_inflight
from rljax.train.rollout.train_batches import Sampled, TrainBatches, sample_now


class SyncSource:
  """Samples batch t with the policy of iteration t, when the trainer asks for it."""

  def __init__(self, batches: TrainBatches, sampler_model):
    self.batches, self.sampler_model = batches, sampler_model

  def take(self, state, it) -> Sampled:
    model, sync = self.sampler_model(state)
    sampled = sample_now(self.batches, state.rng, it, model)
    sampled.stats.update(sync)
    return sampled

  def updated(self, state) -> None:
    """The trainer's new state (nothing to hand over: the next `take` reads it)."""

  def publish(self, version: int) -> None:
    """Nothing to publish: the next `take` samples with the current state."""

  def checkpoint(self, run_dir, step: int) -> None:
    """Nothing is in flight."""

  def close(self) -> None:
    """No thread to stop."""


class AsyncSource:
  """Batch t from the sampler thread, sampled by policy version max(0, t − k); the
  trainer's state is handed over to it after each update (and after a checkpoint)."""

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

  def close(self) -> None:
    self.worker.close()


def make_source(batches: TrainBatches, sampler_model, state, run_dir, step: int):
  """The run's batch source: synchronous (k = 0) or the sampler thread (k > 0)."""
  if batches.spec.max_staleness == 0:
    return SyncSource(batches, sampler_model)
  return AsyncSource(batches, sampler_model, state, run_dir, step)
