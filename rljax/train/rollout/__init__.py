"""Rollouts: prompts in, one scored `RolloutBatch` out, single-turn or episodic.

The run chooses once, at setup (`make_rollouts`): a `SingleTurn` rollout (static or
continuous batching) or an `Episodic` one (an environment per row, `task.env`). Both
answer `sample_and_score(model, prompts, rng, *, sampling=None) -> RolloutBatch`, which
`collect` (dynamic sampling, ReMax's greedy baseline) and `evaluate` use.

The training batch of iteration t (`train_batches.TrainBatches`: its keys, prompts and
scored rollout) is sampled now by the current policy, or ahead by a sampler thread
(`async_rollouts`, with `sampling.max_staleness`); `sources.make_source` picks one for the
loop, and `inflight` checkpoints the batches sampled ahead.
"""

from rljax.train.rollout.batch import EpisodeRecords, RolloutBatch
from rljax.train.rollout.collect import collect
from rljax.train.rollout.context import RolloutContext, encode_prompts, prompt_ids
from rljax.train.rollout.environments import turn_spec
from rljax.train.rollout.episodic import Episodic
from rljax.train.rollout.evaluate import evaluate
from rljax.train.rollout.single_turn import SingleTurn


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


__all__ = ["EpisodeRecords", "Episodic", "RolloutBatch", "RolloutContext", "SingleTurn",
           "collect", "encode_prompts", "evaluate", "make_rollouts", "prompt_ids"]
