"""The update batch: one typed record of everything the update reads about a rollout, and
what a prepared batch says about the run (reward, accuracy, lengths, the old policy's
entropy and token statistics, the train-inference gap, KL to the reference: host floats).

`Preparer.prepare` builds it from a `RolloutBatch` in stages (policy outputs, shaping,
advantages, weights, distillation); each stage returns a new batch with its fields filled
in (`batch._replace(...)`), and nothing writes into a batch after it is built. Fields a
run does not have stay None (a NamedTuple is a pytree: None leaves pass through `jax.jit`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rljax import parallel
from rljax.analysis import token_statistics
from rljax.ops import kl as kl_ops
from rljax.ops.stats import masked_mean
from rljax.train.rollout.batch import RolloutBatch


class UpdateBatch(NamedTuple):
  """B rows (one sampled completion each), P prompt and T completion columns.

  Attributes:
    prompt_tokens, prompt_mask: int [B, P], left-padded prompts.
    tokens: int [B, T], the completions.
    completion_mask: [B, T], the completion's tokens (sampled and observation tokens).
    sampler_logp: float [B, T], the sampler's log-probs of the tokens.
    truncated: bool [B], rows that hit the token budget.
    prompt_lengths, lengths: host int [B], prompt and completion extents (packing layout).
    scores: float [B], the verifier's score, then shaped (`stages.Shaper`).
    valid: float [B], rows in their group's baseline (multi-turn: `algo.on_truncated_episode`).
    keep_loss: float [B], rows that carry loss.
    routes: a MoE policy's sampled experts [B, P + T, L_moe, k], or None.
    greedy_scores: float [B], the greedy completion's score (ReMax), or None.
    reward_components: float [B, K], GDPO's unweighted rewards, or None.
    old_logp, entropy: float [B, T], the old policy's log-probs and entropies.
    ref_logp: float [B, T], the reference's log-probs (the old policy's without one).
    old_values: float [B, T], the critic's values (zeros without a critic).
    sampled_logp, sum_sq: float [B, T], log-probs and Σπ² of the sampling policy (the
      optimal token baseline), or None.
    teacher_logp: float [B, T], the distillation teacher's log-probs, or None.
    distill_penalty: float [B, T], c·(log π_s − log π_t) in the reward, or None.
    advantages, returns: float [B, T].
    mask: [B, T], the loss mask (the completion's tokens of the rows that carry loss).
    token_weights, is_weights: float [B, T], per-token loss and correction weights.
    rng: uint32 [B, 2], key data of each row's key (Clip-Cov's draws).
  """

  prompt_tokens: Any
  prompt_mask: Any
  tokens: Any
  completion_mask: Any
  sampler_logp: Any
  truncated: Any
  prompt_lengths: np.ndarray
  lengths: np.ndarray
  scores: Any
  valid: Any
  keep_loss: Any
  routes: Any = None
  greedy_scores: Any = None
  reward_components: Any = None
  old_logp: Any = None
  entropy: Any = None
  ref_logp: Any = None
  old_values: Any = None
  sampled_logp: Any = None
  sum_sq: Any = None
  teacher_logp: Any = None
  distill_penalty: Any = None
  advantages: Any = None
  returns: Any = None
  mask: Any = None
  token_weights: Any = None
  is_weights: Any = None
  rng: Any = None

  def sequences(self) -> dict:
    """The forward passes' sequence arrays by name (`mask`: the completion's tokens)."""
    return {"prompt_tokens": self.prompt_tokens, "prompt_mask": self.prompt_mask,
            "tokens": self.tokens, "mask": self.completion_mask}

  def extents(self) -> dict:
    """The host lengths of the packing layout: `prompt_lengths` and `lengths` [B]."""
    return {"prompt_lengths": self.prompt_lengths, "lengths": self.lengths}

  def float_mask(self):
    """The completion's tokens as float32 [B, T]."""
    return self.completion_mask.astype(jnp.float32)

  def take(self, index) -> UpdateBatch:
    """Rows `index` (int [n]) of every field."""
    return jax.tree.map(lambda x: x[index], self)


def from_rollout(rollout, keep_loss, valid) -> UpdateBatch:
  """The update batch of a `RolloutBatch` whose sequence arrays are on the trainer's rows:
  its sequences, raw scores and row flags (`keep_loss`, `valid`: host float [B])."""
  return UpdateBatch(
      prompt_tokens=rollout.prompt_tokens, prompt_mask=rollout.prompt_mask,
      tokens=rollout.tokens, completion_mask=rollout.mask, sampler_logp=rollout.sampler_logp,
      truncated=jnp.asarray(rollout.truncated),
      prompt_lengths=np.asarray(rollout.prompt_lengths), lengths=np.asarray(rollout.extent),
      scores=jnp.asarray(rollout.scores), valid=jnp.asarray(valid), keep_loss=keep_loss,
      routes=rollout.routes,
      greedy_scores=(None if rollout.greedy_scores is None
                     else jnp.asarray(rollout.greedy_scores)))


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
