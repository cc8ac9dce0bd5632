"""Loss masks and weights, the preparation stage of `TokenWeightSpec`: the loss mask (rows
that carry loss, DAPO's overlong filter), PSR/NSR sample weights and the high-entropy token
mask, the train-inference correction weights, each row's key, and PF-PPO's resampling."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from rljax.ops import advantages_group, masks
from rljax.train.config.specs import TokenWeightSpec
from rljax.train.update.batch import UpdateBatch


def token_weights(spec: TokenWeightSpec, adv, entropy, mask):
  """Per-token loss weights: PSR/NSR sample weights and the high-entropy token mask, or 1."""
  weights = jnp.ones_like(adv)
  if spec.psr_weight != 1.0 or spec.nsr_weight != 1.0:
    weights = weights * masks.psr_nsr_weights(adv, positive_weight=spec.psr_weight,
                                              negative_weight=spec.nsr_weight)
  if spec.high_entropy_fraction > 0:
    weights = weights * masks.high_entropy_mask(entropy, mask,
                                                top_fraction=spec.high_entropy_fraction)
  return weights


def loss_mask(spec: TokenWeightSpec, upd: UpdateBatch):
  """[B, T]: the completion's tokens of the rows that carry loss, less truncated rows under
  DAPO's overlong filtering."""
  mask = upd.completion_mask
  mask = mask * jnp.asarray(upd.keep_loss, mask.dtype)[:, None]
  if spec.overlong_filter:
    mask = masks.overlong_filter_mask(mask, upd.truncated)
  return mask


@dataclasses.dataclass(frozen=True)
class Weigher:
  """Fills in the loss mask, the token and correction weights and the rows' keys."""

  spec: TokenWeightSpec
  correction: object    # weights(old_logp, sampler_logp, mask) (`old_logp.correction`)

  def __call__(self, upd: UpdateBatch, update_key) -> UpdateBatch:
    """A new batch with `mask`, `token_weights`, `is_weights` and `rng` (needs the
    advantages, old log-probs and entropies)."""
    mask = upd.float_mask()
    return upd._replace(
        mask=loss_mask(self.spec, upd),
        token_weights=token_weights(self.spec, upd.advantages, upd.entropy, mask),
        is_weights=self.correction(upd.old_logp, upd.sampler_logp, mask),
        rng=jax.random.key_data(jax.random.split(update_key, mask.shape[0])))


def pf_ppo_filter(spec: TokenWeightSpec, upd: UpdateBatch, key):
  """PF-PPO: the update batch resampled with replacement, P(row) ∝ w(score) (verl
  `pf_ppo`); returns (a new batch, fraction of distinct rows kept)."""
  weights = advantages_group.pf_ppo_weights(upd.scores, method=spec.pf_ppo,
                                            power=spec.pf_ppo_power)
  index = np.asarray(advantages_group.pf_ppo_resample(jax.random.fold_in(key, 0x9F), weights))
  unique = len(np.unique(index)) / index.shape[0]
  return upd.take(index), unique
