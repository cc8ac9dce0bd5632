"""Rollouts: prompts in, one scored `RolloutBatch` out, single-turn or episodic.

The run chooses once, at setup (`make_rollouts`): a `SingleTurn` rollout (static or
continuous batching) or an `Episodic` one (an environment per row, `task.env`). Both
answer `sample_and_score(model, prompts, rng, *, sampling=None) -> RolloutBatch`, which
`collect` (dynamic sampling, ReMax's greedy baseline) and `evaluate` use.

The training batch of iteration t (`train_batches.TrainBatches`: its keys, prompts and
scored rollout) is sampled now by the current policy (`train_batches.SyncSource`), or ahead
by a sampler thread (`inflight.AsyncSource` over `async_rollouts`, with
`sampling.max_staleness`, its batches in flight checkpointed); `make_source` picks one for
the loop.
"""

from rljax.train.rollout.batch import EpisodeRecords, RolloutBatch
from rljax.train.rollout.context import RolloutContext, encode_prompts, prompt_ids
from rljax.train.rollout.environments import turn_spec
from rljax.train.rollout.episodic import Episodic
from rljax.train.rollout.evaluate import evaluate
from rljax.train.rollout.inflight import AsyncSource
from rljax.train.rollout.single_turn import SingleTurn
from rljax.train.rollout.train_batches import SyncSource, TrainBatches, collect


def make_rollouts(ctx: RolloutContext, spec, *, env_factory=None):
  """The run's rollout: `Episodic` when `spec.episodes` is set (with `env_factory`), else
  `SingleTurn` with the spec's batching.

  Args:
    spec: `rljax.train.config.specs.RolloutSpec`.
  """
  if spec.episodes is None:
    return SingleTurn(ctx, continuous=spec.continuous, slots=spec.slots,
                      share_prefill=spec.share_prefill)
  turn = turn_spec(ctx.tokenizer, ctx.sampling, spec.episodes.turn_stop,
                   spec.episodes.max_observation_tokens)
  return Episodic(ctx, factory=env_factory, turn=turn, episode=spec.episodes)


def make_source(batches: TrainBatches, sampler_model, state, run_dir, step: int):
  """The run's batch source: synchronous (k = 0) or the sampler thread (k > 0)."""
  if batches.spec.max_staleness == 0:
    return SyncSource(batches, sampler_model)
  return AsyncSource(batches, sampler_model, state, run_dir, step)


__all__ = ["EpisodeRecords", "Episodic", "RolloutBatch", "RolloutContext", "SingleTurn",
           "collect", "encode_prompts", "evaluate", "make_rollouts", "make_source", "prompt_ids"]
