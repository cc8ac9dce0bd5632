"""From a scored rollout batch to the update batch: old and reference log-probs, values,
shaped scores, advantages, loss masks and token weights (device arrays), plus the rollout's
metrics."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from rljax import parallel
from rljax.ops import advantages_group, masks, mismatch, shaping
from rljax.ops.off_policy import staleness_metrics
from rljax.ops.value import explained_variance
from rljax.parallel import batch_sharding
from rljax.train.config.specs import Specs
from rljax.train.params import Params, policy_params
from rljax.train.rollout.batch import RolloutBatch
from rljax.train.rollout.turns import episode_metrics, turn_reward_advantages
from rljax.train.update import batch_metrics, routing
from rljax.train.update.advantages import compute_advantages, gdpo_terms
from rljax.train.update.distill import Distiller, distill_metrics
from rljax.train.update.forward import SEQUENCE_KEYS, ForwardFns


def shape_scores(spec, batch: RolloutBatch, moments):
  """Missing-EOS and n-gram repetition penalties, soft overlong punishment, length
  penalty, reward normalisation and clipping (`rljax.ops.shaping`), added to the scores."""
  scores, lengths = jnp.asarray(batch.scores), jnp.asarray(batch.lengths)
  if spec.missing_eos_penalty:
    scores = scores + shaping.missing_eos_penalty(jnp.asarray(batch.truncated),
                                                  penalty=spec.missing_eos_penalty)
  if spec.repetition_penalty:
    scores = scores + shaping.ngram_repetition_penalty(
        batch.tokens, batch.mask, n=spec.repetition_ngram, max_penalty=spec.repetition_penalty)
  if spec.soft_overlong:
    scores = scores + shaping.soft_overlong_penalty(lengths, max_len=spec.max_len,
                                                    cache_len=spec.overlong_cache_len)
  if spec.length_penalty:
    scores = scores + shaping.length_penalty(
        lengths.reshape(-1, spec.group), jnp.asarray(batch.accuracy).reshape(-1, spec.group),
        coef=spec.length_penalty).reshape(-1)
  if spec.reward_norm:
    moments = moments.update(scores, jnp.ones_like(scores))
    scores = shaping.normalize_rewards(scores, moments)
  if spec.reward_clip:
    scores = shaping.clip_rewards(scores, clip=spec.reward_clip)
  return scores, moments


def correction_weights(sources, old_logp, sampler_logp, mask):
  """Train-inference correction weights (TIS / IcePop) per token, or ones; stale samples'
  truncated IS weights (`algo.off_policy_correction='tis'`) are the same TIS weights."""
  if sources.off_policy_correction == "tis":
    return mismatch.truncated_is_weights(old_logp, sampler_logp, mask, cap=sources.tis_cap,
                                         level=sources.is_level)
  if sources.is_correction == "none" or sources.old_logp_source == "sampler":
    return jnp.ones_like(old_logp)
  if sources.is_correction == "tis":
    return mismatch.truncated_is_weights(old_logp, sampler_logp, mask, cap=sources.tis_cap,
                                         level=sources.is_level)
  return mismatch.icepop_weights(old_logp, sampler_logp, mask, low=sources.icepop_low,
                                 high=sources.icepop_high, level=sources.is_level)


def token_weights(spec, adv, entropy, mask):
  """Per-token loss weights: PSR/NSR sample weights and the high-entropy token mask, or 1."""
  weights = jnp.ones_like(adv)
  if spec.psr_weight != 1.0 or spec.nsr_weight != 1.0:
    weights = weights * masks.psr_nsr_weights(adv, positive_weight=spec.psr_weight,
                                              negative_weight=spec.nsr_weight)
  if spec.high_entropy_fraction > 0:
    weights = weights * masks.high_entropy_mask(entropy, mask,
                                                top_fraction=spec.high_entropy_fraction)
  return weights


def pf_ppo_filter(spec, upd, key):
  """PF-PPO: the update batch resampled with replacement, P(row) ∝ w(score) (verl
  `pf_ppo`); returns (batch, fraction of distinct rows kept)."""
  weights = advantages_group.pf_ppo_weights(upd["scores"], method=spec.pf_ppo,
                                            power=spec.pf_ppo_power)
  index = np.asarray(advantages_group.pf_ppo_resample(jax.random.fold_in(key, 0x9F), weights))
  unique = len(np.unique(index)) / index.shape[0]
  return {k: v[index] for k, v in upd.items()}, unique


def staleness(upd, lags, max_lag: int) -> dict:
  """`staleness/mean`, `staleness/max` (versions between the sampler and the trainer; `lags`
  int [B], one per row, or [B, T], one per token with partial rollouts), and
  per lag the share of tokens, the mean |log-prob gap| to the sampler and the mean
  importance weight (`rljax.ops.off_policy.staleness_metrics`)."""
  mask = upd["completion_mask"]
  lag_b = jax.device_put(np.asarray(lags, np.int32), mask.sharding)
  m = staleness_metrics(lag_b, upd["old_logp"], upd["sampler_logp"], mask, max_lag=max_lag)
  out = {"staleness/mean": float(m.lag_mean), "staleness/max": float(m.lag_max)}
  for level in range(max_lag + 1):
    if float(m.token_count_l[level]) > 0:
      out[f"staleness/lag{level}_logp_gap"] = float(m.logp_gap_abs_l[level])
      out[f"staleness/lag{level}_is_weight"] = float(m.is_weight_l[level])
  return out


@dataclasses.dataclass
class Preparer:
  """Turns a `RolloutBatch` into the update step's batch (see `prepare`)."""

  specs: Specs
  fns: ForwardFns
  params: Params
  mesh: object
  reward_names: tuple = ()    # GDPO: the weighted components, in `gdpo_terms` order
  distiller: Distiller | None = None   # on-policy distillation's teacher (algo.distill_*)

  @classmethod
  def create(cls, specs, fns, params, mesh, reward_fn, distiller=None):
    names = gdpo_terms(reward_fn)[0] if specs.advantage.reward_weights else ()
    return cls(specs=specs, fns=fns, params=params, mesh=mesh, reward_names=names,
               distiller=distiller)

  def policy_outputs(self, state, sequences, sampler_logp, mask):
    """(old log-probs, entropies, reference log-probs, values) of the batch's tokens, and
    a MoE rollout's routing metrics (`routing.routing_metrics`; {} otherwise)."""
    source = self.specs.sources.old_logp_source
    routed = {}
    if source == "update":   # filled in by the update step's own forward pass
      old_logp = entropy = jnp.zeros_like(sampler_logp)
    elif "routes" in sequences:   # both routings: the run's old log-probs and the metrics
      out = self.fns.policy_routed(policy_params(state), sequences)
      old_logp, entropy = out["replay" if self.specs.loss.routing_replay else "own"]
      routed = routing.routing_metrics(out["stats"], out["replay"][0], out["own"][0],
                                       sampler_logp, mask)
    else:
      old_logp, entropy = self.fns.policy_stats(policy_params(state), sequences)
    if source == "sampler":
      old_logp = sampler_logp
    ref = self.params.reference_params(state)
    ref_logp = old_logp if ref is None else self.fns.policy_stats(ref, sequences)[0]
    values = (self.fns.values(state.critic, sequences) if state.critic is not None
              else jnp.zeros_like(old_logp))
    return old_logp, entropy, ref_logp, values, routed

  def reward_components(self, batch: RolloutBatch, shaped_scores):
    """[B, K] unweighted reward components in `gdpo_terms` order; the last one is what
    shaping added to the weighted sum."""
    cols = [np.asarray(batch.components[n], np.float32) for n in self.reward_names[:-1]]
    delta = np.asarray(shaped_scores, np.float32) - np.asarray(batch.scores, np.float32)
    return jnp.asarray(np.stack(cols + [delta], axis=1))

  def advantages(self, state, batch: RolloutBatch, inputs, sequences):
    """(advantages [B,T], returns [B,T]) of the run's estimator (per-turn returns for a
    multi-turn run with `algo.turn_rewards`), with on-policy distillation's term in the
    reward or the advantage when the run has a teacher."""
    if self.distiller is not None:   # the teacher's log-probs (and reward penalty)
      self.distiller.score(inputs, sequences)
    if self.specs.advantage.estimator == "optimal_token_baseline":   # sampling policy's Σπ²
      inputs["sampled_logp"], inputs["sum_sq"] = self.fns.policy_sum_sq(policy_params(state),
                                                                        sequences)
    adv, returns, _ = compute_advantages(self.specs.advantage, inputs, state.kl_coef)
    episodes = self.specs.rollout.episodes
    if episodes is not None and episodes.turn_rewards:   # per-turn returns (multi-turn)
      adv = jax.device_put(turn_reward_advantages(batch, inputs, episodes.gamma,
                                                  self.specs.rollout.n),
                           batch_sharding(self.mesh))
      returns = adv
    if self.distiller is not None:
      adv = self.distiller.advantages(adv, inputs)
    return adv, returns

  def prepare(self, state, batch: RolloutBatch, update_key, moments, *, iteration: int = 0):
    """Everything the update needs, as device arrays, the rollout's metrics, and the
    reward-normalisation moments after this batch.

    Returns:
      (update batch dict, metrics dict, moments)
    """
    specs = self.specs
    rows = batch_sharding(self.mesh)
    # The rollout's arrays on the trainer's rows: global arrays already there stay; host rows
    # (dynamic sampling) and the sampler's own devices' rows are placed here.
    batch = dataclasses.replace(batch, **parallel.move(batch.sequence_arrays(), rows))
    seq = {k: getattr(batch, k) for k in SEQUENCE_KEYS}
    if batch.routes is not None:   # a MoE policy's sampled experts
      seq["routes"] = batch.routes
    # completion extent (multi-turn: sampled and observation tokens) for the packing layout
    lengths = {"prompt_lengths": np.asarray(batch.prompt_lengths),
               "lengths": np.asarray(batch.extent)}
    sequences = self.fns.sequences(seq, lengths)
    sampler_logp = batch.sampler_logp
    mask = seq["mask"].astype(jnp.float32)
    old_logp, entropy, ref_logp, values, routed = self.policy_outputs(state, sequences,
                                                                      sampler_logp, mask)
    scores, moments = shape_scores(specs.shaping, batch, moments)
    keep_loss, valid = batch.loss_rows(self._on_truncated())
    inputs = dict(seq, old_logp=old_logp, ref_logp=ref_logp, values=values, scores=scores,
                  valid=jnp.asarray(valid))
    if self.reward_names:
      inputs["reward_components"] = self.reward_components(batch, scores)
    if batch.greedy_scores is not None:
      inputs["greedy_scores"] = jnp.asarray(batch.greedy_scores)
    adv, returns = self.advantages(state, batch, inputs, sequences)
    loss_mask = seq["mask"] * jnp.asarray(keep_loss, seq["mask"].dtype)[:, None]
    if specs.weights.overlong_filter:
      loss_mask = masks.overlong_filter_mask(loss_mask, jnp.asarray(batch.truncated))
    upd = dict(
        prompt_tokens=seq["prompt_tokens"], prompt_mask=seq["prompt_mask"], scores=scores,
        truncated=jnp.asarray(batch.truncated), entropy=entropy, tokens=seq["tokens"],
        mask=loss_mask, old_logp=old_logp, ref_logp=ref_logp, advantages=adv,
        returns=returns, old_values=values,
        token_weights=token_weights(specs.weights, adv, entropy, mask),
        is_weights=correction_weights(specs.sources, old_logp, sampler_logp, mask),
        rng=jax.random.key_data(jax.random.split(update_key, mask.shape[0])),
        sampler_logp=sampler_logp, completion_mask=seq["mask"], **lengths)
    for key in ("reward_components", "teacher_logp"):
      if key in inputs:
        upd[key] = inputs[key]
    if specs.loss.routing_replay:   # the update's forward replays them too
      upd["routes"] = batch.routes
    metrics = self.metrics(state, batch, upd, scores, mask, values)
    metrics.update(routed)
    if self.specs.rollout.max_staleness:
      metrics.update(staleness(upd, iteration - batch.versions, self.specs.rollout.max_staleness))
    if specs.weights.pf_ppo != "none":
      upd, metrics["train/pf_ppo_unique_frac"] = pf_ppo_filter(specs.weights, upd, update_key)
    return upd, metrics, moments

  def _on_truncated(self):
    episodes = self.specs.rollout.episodes
    return () if episodes is None else episodes.on_truncated

  def metrics(self, state, batch: RolloutBatch, upd, scores, mask, values) -> dict:
    """The rollout's metrics (`batch_metrics`), the episodes' (multi-turn) and the critic's
    explained variance."""
    source = self.specs.sources.old_logp_source
    metrics = batch_metrics.rollout_metrics(batch, scores, upd["advantages"], mask,
                                            upd["mask"], state.kl_coef)
    metrics.update(episode_metrics(batch, upd, with_logp_gap=source != "sampler"))
    if source != "update":
      metrics.update(batch_metrics.old_policy_metrics(
          upd, with_ref=self.params.has_reference(state)))
    if "teacher_logp" in upd:   # on-policy distillation
      metrics.update(distill_metrics(upd))
    if state.critic is not None:
      metrics["critic/explained_variance"] = float(explained_variance(values, upd["returns"], mask))
    return metrics
