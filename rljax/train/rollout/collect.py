"""One iteration's rollout batch: draw prompts, sample and score, with DAPO's dynamic
sampling and ReMax's greedy baseline when the run asks for them."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np

from rljax import parallel
from rljax.data.buffer import DynamicSamplingBuffer, DynamicSamplingError
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
  raises a clear error after `spec.max_rounds`. With `spec.greedy_baseline` (ReMax) each
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
  buffer = DynamicSamplingBuffer(spec.prompts_per_iteration, max_rounds=spec.max_rounds)
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
