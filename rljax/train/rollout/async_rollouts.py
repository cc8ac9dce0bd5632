"""Rollouts that overlap the updates: batch t is sampled by policy version max(0, t − k)
in a background thread while the trainer updates (`sampling.max_staleness` = k).

Policy version v is the policy after v updates-per-iteration (`TrainState.iteration` = v).
The schedule is fixed, not opportunistic: batch t always comes from version t − k (after
the first k), so a run is reproducible and no batch is ever staler than k; the sampler runs
up to k iterations ahead of the trainer (one-step off-policy at k = 1, as verl's one-step
off-policy trainer; AReaL bounds staleness the same way, arXiv:2505.24298, Sec. 4). The
sampler thread also draws the prompts and feeds back their success rates, in batch order.

With `sampling.partial_rollouts` the requests of batch t continue with each version
published while they are in flight: segment s of the completion columns is sampled by
version min(t, t − k + s), s = 0..k (`rljax.train.rollout.partial`), so each token records
its own version; the last segment waits for the trainer's version t (fresher tokens for less
overlap).
"""

from __future__ import annotations

import dataclasses
import threading
import time

import numpy as np

from rljax.train.rollout.partial import SegmentedPolicy, column_versions
from rljax.train.rollout.train_batches import Sampled, TrainBatches


def behaviour_version(t: int, k: int) -> int:
  """The policy version that samples batch t under staleness bound k."""
  return max(0, t - k)


def segment_versions(t: int, k: int) -> list[int]:
  """The versions that sample the k + 1 segments of batch t with partial rollouts."""
  return [min(t, behaviour_version(t, k) + s) for s in range(k + 1)]


@dataclasses.dataclass
class InFlight:
  """What a checkpoint at step t keeps of the sampler (`rljax.train.rollout.inflight`).

  Attributes:
    batches: the batches t, t+1, ... sampled ahead of the trainer.
    partial: (prompts, `PartialRows`) of the batch after them, sampled in part, or None.
    models: {version: sampler model} of the versions < t that later segments still need
      (partial rollouts: the checkpoint holds only version t).
  """

  batches: list
  partial: tuple | None = None
  models: dict = dataclasses.field(default_factory=dict)


class _Closed(Exception):
  """The run closed the sampler while it waited for a version."""


class AsyncRollouts:
  """The sampler thread of a run with `sampling.max_staleness` k > 0.

  The trainer `publish`es the sampler's model of every new version and takes batch t with
  `take(t)`; the thread samples batch j as soon as version max(0, j − k) is published.

  Args:
    batches: what samples the training batches (rollouts, prompt sampler, spec, seed).
    state: the state the run starts or resumes from (its PRNG key; its iteration s).
    model: the sampler's model of version s.
    restored: what a checkpoint kept (`in_flight`): batches s, s+1, ... already sampled,
      the batch after them sampled in part, older versions it still needs.
  """

  def __init__(self, batches: TrainBatches, state, model, *, restored: InFlight | None = None):
    restored = restored or InFlight([])
    self.batches, self.k = batches, batches.spec.max_staleness
    self.rng = np.asarray(state.rng)   # a copy: the update step donates the state
    self.start = int(state.iteration)
    self.models = {**restored.models, self.start: model}
    self.ready = {self.start + i: s for i, s in enumerate(restored.batches)}
    self.next = self.start + len(restored.batches)
    self.partial = restored.partial   # (prompts, PartialRows) of batch `next`, mid-sampling
    self.waiting_for = None           # the version the thread waits for, if it waits
    self.error = None
    self._lock = threading.Condition()
    self._stop = False
    self._thread = threading.Thread(target=self._loop, name="rljax-sampler", daemon=True)
    self._thread.start()

  def _sample(self, j: int) -> Sampled:
    spec = self.batches.spec
    draw = self.batches.draw_prompts(j)
    if spec.partial_rollouts:
      draw, policy = self._segmented(j, draw)
    else:
      policy = self._wait_for(behaviour_version(j, self.k))
    batch, stats = self.batches.collect(policy, j, self.rng, draw)
    stats["time/rollout_s"] = stats["time/generate_s"] + stats["time/score_s"]
    if spec.partial_rollouts:
      per_column = column_versions(spec.max_new_tokens, segment_versions(j, self.k))
      batch.versions = np.tile(per_column, (batch.size, 1))
    else:
      batch.versions = np.full(batch.size, behaviour_version(j, self.k), np.int32)
    return Sampled(batch, stats, behaviour_version(j, self.k))

  def _segmented(self, j: int, draw):
    """(draw, SegmentedPolicy) of batch j: its segments wait for their versions; after each
    segment its rows are kept for a checkpoint (`in_flight`); a batch restored in part
    resumes from its rows and its prompts (drawn before the checkpoint)."""
    versions, resume = segment_versions(j, self.k), None
    if self.partial is not None:
      prompts, resume = self.partial
      draw = lambda k, round_=0: prompts  # noqa: E731
    else:
      self._wait_for(versions[0])   # the prompts are drawn once segment 0 can start

      def draw(k, round_=0, first=draw):
        prompts = first(k, round_)
        with self._lock:
          self.partial = (prompts, None)
        return prompts

    def keep(rows):
      with self._lock:
        self.partial = (self.partial[0], rows)
    return draw, SegmentedPolicy(lambda s: self._wait_for(versions[s]), self.k + 1,
                                 resume=resume, on_segment=keep)

  def _wait_for(self, version: int):
    """The sampler's model of `version`, once it is published."""
    with self._lock:
      self.waiting_for = version
      self._lock.notify_all()
      while not self._stop and version not in self.models:
        self._lock.wait()
      self.waiting_for = None
      if self._stop:
        raise _Closed
      return self.models[version]

  def _loop(self):
    try:
      while True:
        sampled = self._sample(self.next)
        with self._lock:
          self.ready[self.next] = sampled
          self.next, self.partial = self.next + 1, None
          self._lock.notify_all()
    except _Closed:
      return
    except Exception as e:  # noqa: BLE001 (re-raised in the trainer's thread by `take`)
      with self._lock:
        self.error = e
        self._lock.notify_all()

  def publish(self, version: int, model) -> None:
    """Makes version `version` available to the sampler; drops models no batch needs."""
    with self._lock:
      self.models[version] = model
      needed = behaviour_version(self.next, self.k)
      self.models = {v: m for v, m in self.models.items() if v >= needed}
      self._lock.notify_all()

  def take(self, t: int) -> Sampled:
    """Batch t (blocks until it is sampled)."""
    t0 = time.perf_counter()
    with self._lock:
      while t not in self.ready and self.error is None:
        self._lock.wait()
      if self.error is not None:
        raise self.error
      sampled = self.ready.pop(t)
    sampled.stats["time/wait_for_sampler_s"] = time.perf_counter() - t0
    return sampled

  def in_flight(self, t: int) -> InFlight:
    """What the sampler holds for a checkpoint at step t (`InFlight`), once the thread
    waits for a version not yet published: what is sampled then is fixed by the schedule
    (k batches; with partial rollouts, one batch's segments up to that version), not by
    timing."""
    with self._lock:
      while self.error is None and (self.waiting_for is None
                                    or self.waiting_for in self.models):
        self._lock.wait()
      if self.error is not None:
        raise self.error
      batches = [self.ready[j] for j in sorted(self.ready) if j >= t]
      if not self.batches.spec.partial_rollouts:
        return InFlight(batches)
      partial = self.partial if self.partial and self.partial[1] is not None else None
      return InFlight(batches, partial, {v: m for v, m in self.models.items() if v < t})

  def close(self) -> None:
    with self._lock:
      self._stop = True
      self._lock.notify_all()
    self._thread.join(timeout=600)
