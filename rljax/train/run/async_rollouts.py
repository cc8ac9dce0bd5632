"""Rollouts that overlap the updates: batch t is sampled by policy version max(0, t − k)
in a background thread while the trainer updates (`sampling.max_staleness` = k).

Policy version v is the policy after v updates-per-iteration (`TrainState.iteration` = v).
The schedule is fixed, not opportunistic: batch t always comes from version t − k (after
the first k), so a run is reproducible and no batch is ever staler than k; the sampler runs
up to k iterations ahead of the trainer (one-step off-policy at k = 1, as verl's one-step
off-policy trainer; AReaL bounds staleness the same way, arXiv:2505.24298, Sec. 4). The
sampler thread also draws the prompts and feeds back their success rates, in batch order.
"""

from __future__ import annotations

import threading
import time

import jax
import numpy as np

from rljax.train.rollout import collect
from rljax.train.run.build import Run
from rljax.train.run.iteration import (
    Sampled,
    draw_prompts_fn,
    feed_back_success,
    iteration_keys,
)


def behaviour_version(t: int, k: int) -> int:
  """The policy version that samples batch t under staleness bound k."""
  return max(0, t - k)


class AsyncRollouts:
  """The sampler thread of a run with `sampling.max_staleness` k > 0.

  The trainer `publish`es the sampler's model of every new version and takes batch t with
  `take(t)`; the thread samples batch j as soon as version max(0, j − k) is published.

  Args:
    run: the built run (rollouts, prompt sampler, specs).
    state: the state the run starts or resumes from (its PRNG key; its iteration s).
    model: the sampler's model of version s.
    restored: batches s, s+1, ... already sampled before a resume (from a checkpoint).
  """

  def __init__(self, run: Run, state, model, *, restored=()):
    self.run, self.k = run, run.specs.rollout.max_staleness
    self.rng = np.asarray(state.rng)   # a copy: the update step donates the state
    self.start = int(state.iteration)
    self.models = {self.start: model}
    self.ready = {self.start + i: s for i, s in enumerate(restored)}
    self.next = self.start + len(restored)
    self.error = None
    self._lock = threading.Condition()
    self._stop = False
    self._thread = threading.Thread(target=self._loop, name="rljax-sampler", daemon=True)
    self._thread.start()

  def _sample(self, j: int, model) -> Sampled:
    run, spec = self.run, self.run.specs.rollout
    keys = iteration_keys(self.rng, j, run.specs.run.sample_stream)
    batch, stats = collect(run.rollouts, model, draw_prompts_fn(run, j),
                           lambda round_: jax.random.fold_in(keys["sample"], round_), spec,
                           greedy_key=keys["greedy"])
    feed_back_success(run, batch.prompts, batch.accuracy, spec.n)
    stats["time/rollout_s"] = stats["time/generate_s"] + stats["time/score_s"]
    batch.versions = np.full(batch.size, behaviour_version(j, self.k), np.int32)
    return Sampled(batch, stats, behaviour_version(j, self.k))

  def _loop(self):
    try:
      while True:
        with self._lock:
          while not self._stop and behaviour_version(self.next, self.k) not in self.models:
            self._lock.wait()
          if self._stop:
            return
          j, model = self.next, self.models[behaviour_version(self.next, self.k)]
        sampled = self._sample(j, model)
        with self._lock:
          self.ready[j] = sampled
          self.next = j + 1
          self._lock.notify_all()
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

  def in_flight(self, t: int) -> list:
    """The batches t, t+1, ... that are sampled ahead of the trainer, once every batch
    that can be sampled from the published versions is (their number is then fixed: k,
    the checkpoint's content does not depend on timing)."""
    with self._lock:
      while (self.error is None
             and behaviour_version(self.next, self.k) in self.models):
        self._lock.wait()
      if self.error is not None:
        raise self.error
      return [self.ready[j] for j in sorted(self.ready) if j >= t]

  def close(self) -> None:
    with self._lock:
      self._stop = True
      self._lock.notify_all()
    self._thread.join(timeout=600)
