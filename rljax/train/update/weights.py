"""Loss masks and weights, the preparation stage of `TokenWeightSpec`: the loss mask (rows
that carry loss, DAPO's overlong filter), PSR/NSR sample weights and the high-entropy token
mask, the train-inference correction weights, each row's key, and PF-PPO's resampling.

The optional filters are declared once in `FILTERS`, with the `TokenWeightSpec` field that
turns each on; the `Weigher` keeps the ones a run turns on, chosen when it is built.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from rljax.ops import advantages_group, masks
from rljax.train.config.specs import TokenWeightSpec
from rljax.train.update.batch import UpdateBatch
from rljax.train.update.stages import enabled


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
  correction: object    # weights(old_logp, sampler_logp, mask) (`old_logp.correction`)
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
