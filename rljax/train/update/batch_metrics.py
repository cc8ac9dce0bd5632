"""What one prepared batch says about the run: reward, accuracy, lengths, the old policy's
entropy and token statistics, the train-inference gap, KL to the reference (host floats)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from rljax import parallel
from rljax.analysis import token_statistics
from rljax.ops import kl as kl_ops
from rljax.ops.stats import masked_mean
from rljax.train.rollout.batch import RolloutBatch


def _nanmean_or_nan(v) -> float:
  v = np.asarray(v, np.float64)
  return float(np.nanmean(v)) if np.isfinite(v).any() else float("nan")


def rollout_metrics(batch: RolloutBatch, scores, adv, mask, loss_mask, kl_coef) -> dict:
  """Reward, accuracy, length and batch metrics of one rollout."""
  return {
      "train/reward": float(jnp.mean(scores)),
      "train/raw_score": float(np.mean(batch.scores)),
      "train/accuracy": float(np.mean(batch.accuracy)),
      "train/format": float(np.mean(batch.format)),
      "train/reward_failures": int(np.sum(batch.reward_failed)),
      **{f"reward/{k}": _nanmean_or_nan(v) for k, v in batch.components.items()},
      "train/response_length_mean": float(np.mean(batch.lengths)),
      "train/response_length_max": float(np.max(batch.lengths)),
      "train/truncated_frac": float(np.mean(parallel.gather(batch.truncated))),
      **length_metrics(batch, loss_mask),
      "train/advantage_abs_mean": float(masked_mean(jnp.abs(adv), mask)),
      "train/effective_batch": float(jnp.sum(jnp.any(loss_mask > 0, axis=1) &
                                             jnp.any(adv != 0, axis=1))),
      "kl/coef": float(kl_coef),
  }


def length_metrics(batch: RolloutBatch, loss_mask) -> dict:
  """Length tail and length by outcome (DAPO, arXiv:2503.14476, Figs. 4-5; Dr. GRPO,
  arXiv:2503.20783, Sec. 3.1: a sequence-mean loss lets incorrect answers grow) and the loss
  tokens truncated rows still carry (0 under overlong filtering). NaN when no row of that
  outcome exists."""
  lengths = np.asarray(batch.lengths, np.float64)
  correct = np.asarray(batch.accuracy) > 0

  def mean_or_nan(x):
    return float(np.mean(x)) if x.size else float("nan")
  return {"train/response_length_p90": float(np.percentile(lengths, 90)),
          "train/length_correct": mean_or_nan(lengths[correct]),
          "train/length_incorrect": mean_or_nan(lengths[~correct]),
          "train/truncated_loss_tokens": float(jnp.sum(
              (loss_mask > 0) & jnp.asarray(batch.truncated, bool)[:, None]))}


def worked_metrics(batch: RolloutBatch) -> dict:
  """Accuracy of the completions in the task's worked mode and of the others (the mode RL
  promotes when it is the more reliable one), from the reward's "worked" component."""
  worked = np.asarray(batch.components["worked"]) > 0
  acc = np.asarray(batch.accuracy, np.float64)
  mean_or_nan = lambda x: float(np.mean(x)) if x.size else float("nan")  # noqa: E731
  return {"train/worked_accuracy": mean_or_nan(acc[worked]),
          "train/direct_accuracy": mean_or_nan(acc[~worked])}


# The rollout metrics of a reward component, (the component, metrics(batch) -> dict): a
# run's reward has the component or not, chosen once (`component_metrics`)
COMPONENT_METRICS = (("worked", worked_metrics),)


def component_metrics(reward_fn) -> tuple:
  """The `COMPONENT_METRICS` of the components `reward_fn` (`rljax.rewards.base.Composite`)
  has (every batch's `components` are its terms)."""
  names = {name for name, _, _ in reward_fn.terms}
  return tuple(metrics for name, metrics in COMPONENT_METRICS if name in names)


def old_policy_metrics(upd, *, with_ref: bool) -> dict:
  """Rollout metrics that need the old policy's log-probs and entropies (in the
  `UpdateBatch` `upd`)."""
  mask = upd.completion_mask.astype(jnp.float32)
  old_logp, entropy = upd.old_logp, upd.entropy
  gap = (old_logp - upd.sampler_logp) * mask
  metrics = {
      "train/entropy_rollout": float(masked_mean(entropy, mask)),
      "mismatch/logp_gap_mean": float(jnp.sum(jnp.abs(gap)) / jnp.maximum(jnp.sum(mask), 1)),
      "mismatch/logp_gap_max": float(jnp.max(jnp.abs(gap))),
  }
  metrics.update(token_statistics(*parallel.gather((old_logp, entropy, upd.advantages,
                                                    upd.mask))))
  if with_ref:
    kl_ref = kl_ops.kl_estimate(old_logp, upd.ref_logp, "k3")
    metrics["kl/to_ref"] = float(masked_mean(kl_ref, mask))
  return metrics

