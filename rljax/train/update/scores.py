"""Reward shaping, the preparation stage of `ShapingSpec`: missing-EOS and n-gram repetition
penalties, soft overlong punishment and length penalty added to the verifier's score, then
reward normalisation and clipping (`rljax.ops.shaping`).

Each step is declared once in `STEPS`, with the `ShapingSpec` field that turns it on; the
`Shaper` keeps the steps a run turns on, chosen when it is built.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from rljax.ops import shaping
from rljax.train.config.specs import ShapingSpec
from rljax.train.update.batch import UpdateBatch
from rljax.train.update.stages import enabled


def _missing_eos(spec, rollout, scores, moments):
  return scores + shaping.missing_eos_penalty(jnp.asarray(rollout.truncated),
                                              penalty=spec.missing_eos_penalty), moments


def _repetition(spec, rollout, scores, moments):
  return scores + shaping.ngram_repetition_penalty(
      rollout.tokens, rollout.mask, n=spec.repetition_ngram,
      max_penalty=spec.repetition_penalty), moments


def _soft_overlong(spec, rollout, scores, moments):
  return scores + shaping.soft_overlong_penalty(jnp.asarray(rollout.lengths),
                                                max_len=spec.max_len,
                                                cache_len=spec.overlong_cache_len), moments


def _length(spec, rollout, scores, moments):
  group = spec.group
  return scores + shaping.length_penalty(
      jnp.asarray(rollout.lengths).reshape(-1, group),
      jnp.asarray(rollout.accuracy).reshape(-1, group),
      coef=spec.length_penalty).reshape(-1), moments


def _normalize(spec, rollout, scores, moments):
  moments = moments.update(scores, jnp.ones_like(scores))
  return shaping.normalize_rewards(scores, moments), moments


def _clip(spec, rollout, scores, moments):
  return shaping.clip_rewards(scores, clip=spec.reward_clip), moments


# (the ShapingSpec field that turns the step on, step(spec, rollout, scores, moments) ->
# (scores, moments)), in the order they apply
STEPS = (("missing_eos_penalty", _missing_eos), ("repetition_penalty", _repetition),
         ("soft_overlong", _soft_overlong), ("length_penalty", _length),
         ("reward_norm", _normalize), ("reward_clip", _clip))


@dataclasses.dataclass(frozen=True)
class Shaper:
  """The shaping steps a run turns on (`create`), applied to a batch's scores."""

  spec: ShapingSpec
  steps: tuple = ()

  @classmethod
  def create(cls, spec: ShapingSpec) -> Shaper:
    """The shaper of the steps `spec` turns on."""
    return cls(spec, enabled(spec, STEPS))

  def __call__(self, upd: UpdateBatch, rollout, moments):
    """(a new batch with the shaped `scores`, the reward-normalisation moments after it).

    Args:
      upd: the batch, with the verifier's `scores`.
      rollout: its `RolloutBatch` (tokens, truncation, lengths, accuracy).
    """
    scores = upd.scores
    for step in self.steps:
      scores, moments = step(self.spec, rollout, scores, moments)
    return upd._replace(scores=scores), moments
