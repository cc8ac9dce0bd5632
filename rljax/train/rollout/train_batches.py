"""The training batch of iteration t: its keys, its prompts, and the scored rollout of them
(`collect`: sample and score, with DAPO's dynamic sampling and ReMax's greedy baseline when
the run asks for them); the synchronous loop samples it now (`SyncSource`).

Everything here is a function of (run seed, iteration) and the policy that samples, so every
arm of an ablation draws the same keys and prompts (common random numbers), and the
synchronous loop, the sampler thread (`rljax.train.rollout.async_rollouts`) and a resumed run
sample the same batch t.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import time

import jax
import numpy as np

from rljax import parallel
from rljax.data.buffer import DynamicSamplingBuffer, DynamicSamplingError
from rljax.data.samplers import UniformSampler
from rljax.train.config.specs import RolloutSpec
from rljax.train.rollout.batch import RolloutBatch


def zero_variance_fraction(accuracy, n: int) -> float:
  """Share of groups whose n samples all have the same accuracy (no GRPO signal)."""
  return float(np.mean(np.asarray(accuracy).reshape(-1, n).std(axis=1) == 0)) if n > 1 else 0.0


def _refill(buffer, batch: RolloutBatch, n: int):
  """Adds one round's groups to the dynamic-sampling buffer; the batch it completes, or None."""
  rows = parallel.gather(batch.rows())   # the buffer picks groups on the host: all rows
  rows["prompt"] = [batch.prompts[i // n] for i in range(len(batch.prompts) * n)]
  rows["total_scores"] = rows.pop("scores")   # the buffer keeps its filter metric as "scores"
  try:
    buffer.add(rows["accuracy"], rows.pop("group_id"), **rows)
  except DynamicSamplingError as err:
    raise DynamicSamplingError(f"{err} (config field: algo.dynamic_sampling_max_rounds)") from err
  if not buffer.ready:
    return None
  rows = buffer.take()
  rows["scores"] = rows.pop("total_scores")
  return RolloutBatch.from_rows(rows, rows.pop("prompt")[::n])


def collect(rollouts, model, draw_prompts, rng_fn, spec: RolloutSpec, *, greedy_key=None):
  """Samples and scores `spec.prompts_per_iteration` groups of `spec.n` completions.

  With dynamic sampling (DAPO, arXiv:2503.14476, Sec. 3.2, Eq. 11) groups whose
  accuracies are all equal are dropped (the verl recipe filters on accuracy) and more
  prompts are drawn until the groups are filled; `rljax.data.buffer.DynamicSamplingBuffer`
  raises a clear error after `spec.dynamic_sampling_max_rounds`. With `spec.greedy_baseline` (ReMax) each
  prompt's greedy completion is scored too (`greedy_key`).

  Args:
    rollouts: a `SingleTurn` or `Episodic` rollout.
    draw_prompts: `draw_prompts(k, round) -> k prompts` (round 0, 1, ... of this iteration).
    rng_fn: `rng_fn(round) -> key`, the sampling key of a generation round.
  Returns:
    (RolloutBatch of B = prompts·n rows in group-major order, stats dict). The stats'
    `train/sampled_score` is the mean score (the reward before shaping) of every completion
    sampled in every round, before the dynamic-sampling filter: the policy's reward on the
    training prompts, whatever the filter kept (`train/reward` is the update batch's).
  """
  n = spec.n
  seconds = {"generate_s": 0.0, "score_s": 0.0}
  buffer = DynamicSamplingBuffer(spec.prompts_per_iteration,
                                max_rounds=spec.dynamic_sampling_max_rounds)
  zero_var = None
  sampled = []   # every round's scores, before the filter
  for round_ in itertools.count():
    batch = rollouts.sample_and_score(model, draw_prompts(spec.prompts_per_iteration, round_),
                                      rng_fn(round_))
    seconds = {k: v + batch.seconds[k] for k, v in seconds.items()}
    sampled.append(np.asarray(batch.scores))
    if zero_var is None:
      zero_var = zero_variance_fraction(batch.accuracy, n)
    if not spec.dynamic_sampling:
      break
    batch = _refill(buffer, batch, n)
    if batch is not None:
      break
  if spec.greedy_baseline:
    greedy = rollouts.ctx.sampling.replace(greedy=True, n=1)
    scores = rollouts.sample_and_score(model, batch.prompts, greedy_key, sampling=greedy).scores
    batch = dataclasses.replace(batch, greedy_scores=np.repeat(scores, n))
  stats = {"train/generation_rounds": buffer.last_stats.get("rounds", 1),
           "train/zero_variance_group_frac": zero_var,
           "train/sampled_score": float(np.mean(np.concatenate(sampled))),
           "time/generate_s": seconds["generate_s"], "time/score_s": seconds["score_s"]}
  return batch, stats


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


class SyncSource:
  """The batch source of a synchronous run (`sampling.max_staleness` = 0): batch t is
  sampled with the policy of iteration t, when the trainer asks for it. (The asynchronous
  one, `rljax.train.rollout.inflight.AsyncSource`, answers the same calls.) `sampler_model(
  state, keep=False) -> (model, sync metrics)` puts the state's policy on the sampler's
  devices (`rljax.train.params.Params.sampler_model`)."""

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

  def prune(self, run_dir, keep_steps) -> None:
    """Nothing was written beside the checkpoints."""

  def close(self) -> None:
    """No thread to stop."""
