"""The training batch of iteration t: its keys, its prompts, and the scored rollout of them.

Everything here is a function of (run seed, iteration) and the policy that samples, so every
arm of an ablation draws the same keys and prompts (common random numbers), and the
synchronous loop, the sampler thread (`rljax.train.rollout.async_rollouts`) and a resumed run
sample the same batch t.
"""

from __future__ import annotations

import dataclasses
import functools
import time

import jax
import numpy as np

from rljax.data.samplers import UniformSampler
from rljax.train.config.specs import RolloutSpec
from rljax.train.rollout.collect import collect

_EXTRA_ROUNDS = 0xD5   # folds the stream of dynamic sampling's extra rounds


def iteration_keys(rng_data, iteration, sample_stream: int = 0):
  """The iteration's keys for sampling, the update and the greedy baseline: functions of
  (run seed, iteration) alone (`rng_data`: the key data of the run seed, `TrainState.rng`),
  so every arm of an ablation draws the same ones (common
  random numbers); `sample_stream` > 0 gives the sampling key its own stream (an A/A
  control that shares everything but the sampling noise)."""
  # from host data: the keys are uncommitted, usable on the trainer's and the sampler's devices
  base = jax.random.fold_in(jax.random.wrap_key_data(np.asarray(rng_data)), iteration)
  keys = dict(zip(("sample", "update", "greedy"), jax.random.split(base, 3)))
  if sample_stream:
    keys["sample"] = jax.random.fold_in(keys["sample"], sample_stream)
  return keys


@dataclasses.dataclass
class Sampled:
  """A scored rollout batch and the policy version (iteration) that sampled it."""

  batch: object
  stats: dict
  version: int


@dataclasses.dataclass
class TrainBatches:
  """What samples the training batches: the run's rollout, its prompt sampler (whose state
  is checkpointed with the run), the rollout spec, and the run seed and sample stream that
  the keys and the extra prompt rounds come from.

  Attributes:
    rollouts: the run's `SingleTurn` or `Episodic` rollout.
    prompt_sampler: uniform | curriculum | prioritized (`rljax.data.samplers`) over
      `rollouts.ctx.task.train_prompts()`.
  """

  rollouts: object
  prompt_sampler: object
  spec: RolloutSpec
  seed: int
  sample_stream: int = 0

  @functools.cached_property
  def prompt_index(self) -> dict:
    """Prompt id -> index into the task's train prompts."""
    return {p.id: i for i, p in enumerate(self.rollouts.ctx.task.train_prompts())}

  def keys(self, rng_data, iteration) -> dict:
    """`iteration_keys` of this run's sample stream."""
    return iteration_keys(rng_data, iteration, self.sample_stream)

  def draw_prompts(self, iteration: int):
    """`draw(k, round) -> k prompts`: round 0 from the prompt sampler (one call per
    iteration); the extra rounds of dynamic sampling from (seed, iteration, round) alone
    under the uniform sampler, so arms with and without dynamic sampling see the same
    prompts in every iteration's first round and after it."""
    prompts = self.rollouts.ctx.task.train_prompts()

    def draw(k, round_=0):
      if round_ == 0 or not isinstance(self.prompt_sampler, UniformSampler):
        index = self.prompt_sampler.sample(k)
      else:
        rng = np.random.default_rng([self.seed, _EXTRA_ROUNDS, iteration, round_])
        index = rng.choice(len(prompts), k, replace=len(prompts) < k)
      return [prompts[i] for i in index]
    return draw

  def feed_back(self, prompts, accuracy) -> None:
    """Per-prompt success rates to the sampler (prioritized sampling tracks them online)."""
    index = np.asarray([self.prompt_index[p.id] for p in prompts])
    self.prompt_sampler.update(index, np.asarray(accuracy).reshape(-1, self.spec.n).mean(axis=1))

  def collect(self, policy, iteration: int, rng_data, draw=None):
    """(RolloutBatch, stats) of `iteration` sampled by `policy` (a model, or a
    `SegmentedPolicy`), its prompts drawn by `draw` (default: `draw_prompts(iteration)`);
    their success rates are fed back to the prompt sampler."""
    keys = self.keys(rng_data, iteration)
    batch, stats = collect(self.rollouts, policy, draw or self.draw_prompts(iteration),
                           lambda round_: jax.random.fold_in(keys["sample"], round_), self.spec,
                           greedy_key=keys["greedy"])
    self.feed_back(batch.prompts, batch.accuracy)
    return batch, stats


def sample_now(batches: TrainBatches, rng_data, iteration: int, model) -> Sampled:
  """The synchronous rollout of `iteration`, by the current policy `model` (`rng_data`:
  `TrainState.rng`)."""
  t0 = time.perf_counter()
  batch, stats = batches.collect(model, iteration, rng_data)
  stats["time/rollout_s"] = time.perf_counter() - t0
  batch.versions = np.full(batch.size, iteration, np.int32)
  return Sampled(batch, stats, iteration)
