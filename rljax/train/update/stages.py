"""The table-driven preparation stages: feature tables (`enabled`), reward shaping
(`ShapingSpec`, `Shaper`) and loss masks and weights (`TokenWeightSpec`, `Weigher`).

Each optional step of a stage is declared once, beside the spec field that turns it on, and
the steps a run turns on are chosen once from its spec (`enabled`), when the stage is built.

- Shaping: missing-EOS and n-gram repetition penalties, soft overlong punishment and length
  penalty added to the verifier's score, then reward normalisation and clipping
  (`rljax.ops.shaping`; the steps in `STEPS`).
- Weights: the loss mask (rows that carry loss, DAPO's overlong filter), PSR/NSR sample
  weights and the high-entropy token mask (the filters in `FILTERS`), the train-inference
  correction weights, each row's key, and PF-PPO's resampling (`pf_ppo_filter`).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from rljax.ops import advantages_group, masks, shaping
from rljax.train.config.specs import ShapingSpec, TokenWeightSpec
from rljax.train.update.batch import UpdateBatch


def _is_on(value) -> bool:
  """A field's value turns its step on unless it is falsy or "none" (the config's off)."""
  return bool(value) and not (isinstance(value, str) and value == "none")


@functools.cache
def enabled(spec, table: tuple) -> tuple:
  """The steps of `table` ((spec field, step) pairs, in order) whose field is set in `spec`
  (a frozen dataclass): not 0, False, empty or "none". A field the spec does not have is an
  error, not a silent "off"."""
  fields = {f.name for f in dataclasses.fields(spec)}
  unknown = [name for name, _ in table if name not in fields]
  if unknown:
    raise ValueError(f"{type(spec).__name__} has no field {unknown}")
  return tuple(step for name, step in table if _is_on(getattr(spec, name)))


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


def _overlong_filter(spec, upd: UpdateBatch, mask, weights):
  """DAPO's overlong filtering: no loss on truncated rows."""
  return masks.overlong_filter_mask(mask, upd.truncated), weights


def _high_entropy(spec, upd: UpdateBatch, mask, weights):
  """Only the top `high_entropy_fraction` of the completion's tokens by entropy."""
  return mask, weights * masks.high_entropy_mask(upd.entropy, upd.float_mask(),
                                                 top_fraction=spec.high_entropy_fraction)


# (the TokenWeightSpec field that turns a filter on, filter(spec, batch, loss mask, token
# weights) -> (loss mask, token weights)), in the order they apply
FILTERS = (("overlong_filter", _overlong_filter), ("high_entropy_fraction", _high_entropy))


@dataclasses.dataclass(frozen=True)
class Weigher:
  """Fills in the loss mask, the token and correction weights and the rows' keys."""

  spec: TokenWeightSpec
  correction: object    # weights(old_logp, sampler_logp, mask) (`forward.correction`)
  filters: tuple = ()   # the `FILTERS` the run turns on (`create`)

  @classmethod
  def create(cls, spec: TokenWeightSpec, correction) -> Weigher:
    """The weigher of the filters `spec` turns on."""
    return cls(spec, correction, enabled(spec, FILTERS))

  def __call__(self, upd: UpdateBatch, update_key) -> UpdateBatch:
    """A new batch with `mask` (the completion's tokens of the rows that carry loss),
    `token_weights` (PSR/NSR sample weights: 1 for both signs by default), `is_weights` and
    `rng`, after the run's filters (needs the advantages, old log-probs and entropies)."""
    completion = upd.completion_mask
    mask = completion * jnp.asarray(upd.keep_loss, completion.dtype)[:, None]
    weights = jnp.ones_like(upd.advantages) * masks.psr_nsr_weights(
        upd.advantages, positive_weight=self.spec.psr_weight,
        negative_weight=self.spec.nsr_weight)
    for step in self.filters:
      mask, weights = step(self.spec, upd, mask, weights)
    float_mask = upd.float_mask()
    return upd._replace(
        mask=mask, token_weights=weights,
        is_weights=self.correction(upd.old_logp, upd.sampler_logp, float_mask),
        rng=jax.random.key_data(jax.random.split(update_key, float_mask.shape[0])))


def pf_ppo_filter(spec: TokenWeightSpec, upd: UpdateBatch, key):
  """PF-PPO: the update batch resampled with replacement, P(row) ∝ w(score) (verl
  `pf_ppo`); returns (a new batch, fraction of distinct rows kept)."""
  weights = advantages_group.pf_ppo_weights(upd.scores, method=spec.pf_ppo,
                                            power=spec.pf_ppo_power)
  index = np.asarray(advantages_group.pf_ppo_resample(jax.random.fold_in(key, 0x9F), weights))
  unique = len(np.unique(index)) / index.shape[0]
  return upd.take(index), unique
