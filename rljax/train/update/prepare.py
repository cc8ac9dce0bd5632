"""From a scored rollout batch to the update batch (`UpdateBatch`): old and reference
log-probs, values, shaped scores, advantages, loss masks and token weights (device arrays),
plus the rollout's metrics.

Preparation is a short list of stages, each owning one spec and returning a new batch:
policy outputs (`PolicySourcesSpec`, through the run's `old_logp` strategy), shaping
(`ShapingSpec`, `stages.Shaper`), advantages (`AdvantageSpec`), distillation
(`DistillSpec`, `advantages.Distiller`) and weights (`TokenWeightSpec`, `stages.Weigher`).
The optional steps (the estimator's extra inputs, the staleness metrics, PF-PPO) are
declared once in tables beside the spec field that turns each on, and chosen once
(`Preparer.create`).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from rljax import parallel
from rljax.ops.off_policy import staleness_metrics
from rljax.ops.value import explained_variance
from rljax.parallel import batch_sharding
from rljax.train.config.specs import Specs
from rljax.train.params import Params, policy_params
from rljax.train.rollout.batch import RolloutBatch, episode_metrics, turn_reward_advantages
from rljax.train.update.advantages import (
  Distiller,
  NoTeacher,
  compute_advantages,
  distill_metrics,
  gdpo_terms,
)
from rljax.train.update.batch import (
  UpdateBatch,
  component_metrics,
  from_rollout,
  rollout_metrics,
)
from rljax.train.update.forward import ForwardFns, Recompute, old_logp_source
from rljax.train.update.stages import Shaper, Weigher, enabled, pf_ppo_filter


def staleness(upd: UpdateBatch, lags, max_lag: int) -> dict:
  """`staleness/mean`, `staleness/max` (versions between the sampler and the trainer; `lags`
  int [B], one per row, or [B, T], one per token with partial rollouts), and
  per lag the share of tokens, the mean |log-prob gap| to the sampler and the mean
  importance weight (`rljax.ops.off_policy.staleness_metrics`)."""
  mask = upd.completion_mask
  lag_b = jax.device_put(np.asarray(lags, np.int32), mask.sharding)
  m = staleness_metrics(lag_b, upd.old_logp, upd.sampler_logp, mask, max_lag=max_lag)
  out = {"staleness/mean": float(m.lag_mean), "staleness/max": float(m.lag_max)}
  for level in range(max_lag + 1):
    if float(m.token_count_l[level]) > 0:
      out[f"staleness/lag{level}_logp_gap"] = float(m.logp_gap_abs_l[level])
      out[f"staleness/lag{level}_is_weight"] = float(m.is_weight_l[level])
  return out


def _reward_components(p: Preparer, state, upd: UpdateBatch, rollout: RolloutBatch,
                       sequences) -> UpdateBatch:
  """GDPO: a new batch with the [B, K] unweighted reward components in `gdpo_terms` order;
  the last one is what shaping added to the weighted sum."""
  cols = [np.asarray(rollout.components[n], np.float32) for n in p.reward_names[:-1]]
  delta = np.asarray(upd.scores, np.float32) - np.asarray(rollout.scores, np.float32)
  return upd._replace(reward_components=jnp.asarray(np.stack(cols + [delta], axis=1)))


def _sampling_sum_sq(p: Preparer, state, upd: UpdateBatch, rollout, sequences) -> UpdateBatch:
  """The optimal token baseline: a new batch with the sampling policy's log-probs and
  Σ_v π_v² of its tokens."""
  sampled_logp, sum_sq = p.fns.policy_sum_sq(policy_params(state), sequences)
  return upd._replace(sampled_logp=sampled_logp, sum_sq=sum_sq)


# The advantage estimate's optional inputs, (the AdvantageSpec field that asks for one,
# step(preparer, state, batch, rollout, sequences) -> batch), in order
ADVANTAGE_INPUTS = (("reward_weights", _reward_components),
                    ("sampling_sum_sq", _sampling_sum_sq))


def _staleness(p: Preparer, upd: UpdateBatch, rollout: RolloutBatch, key, iteration: int):
  max_lag = p.specs.rollout.max_staleness
  return upd, staleness(upd, iteration - rollout.versions, max_lag)


def _pf_ppo(p: Preparer, upd: UpdateBatch, rollout, key, iteration: int):
  upd, unique = pf_ppo_filter(p.specs.weights, upd, key)
  return upd, {"train/pf_ppo_unique_frac": unique}


# The steps after the rollout's metrics, (the spec field that turns one on, step(preparer,
# batch, rollout, update key, iteration) -> (batch, metrics)): an asynchronous run's
# staleness metrics (`RolloutSpec`), then PF-PPO's resampling (`TokenWeightSpec`)
STALENESS = (("max_staleness", _staleness),)
RESAMPLING = (("pf_ppo", _pf_ppo),)


@dataclasses.dataclass
class Preparer:
  """Turns a `RolloutBatch` into the update batch (see `prepare`); its stages are chosen
  once, by `create`."""

  specs: Specs
  fns: ForwardFns
  params: Params
  mesh: object
  reward_names: tuple = ()    # GDPO: the weighted components, in `gdpo_terms` order
  distiller: Distiller | None = None   # on-policy distillation's teacher (algo.distill_*)
  old_logp: Recompute = Recompute()    # where the old log-probs come from
  shaper: Shaper | None = None
  weigher: Weigher | None = None
  inputs: tuple = ()     # the `ADVANTAGE_INPUTS` the run's estimate reads
  finish: tuple = ()     # the `STALENESS` and `RESAMPLING` steps the run turns on
  components: tuple = ()   # the reward components' metrics (`component_metrics`)

  @classmethod
  def create(cls, specs, fns, params, mesh, reward_fn, distiller=None):
    """The preparer of a run: the old-log-prob strategy, the shaping steps, the advantage
    estimate's inputs, the correction weights and the last steps, chosen once from
    `specs`."""
    source = old_logp_source(specs)
    return cls(specs=specs, fns=fns, params=params, mesh=mesh,
               reward_names=gdpo_terms(reward_fn)[0], distiller=distiller, old_logp=source,
               shaper=Shaper.create(specs.shaping),
               weigher=Weigher.create(specs.weights, source.correction(specs.sources)),
               inputs=enabled(specs.advantage, ADVANTAGE_INPUTS),
               finish=enabled(specs.rollout, STALENESS) + enabled(specs.weights, RESAMPLING),
               components=component_metrics(reward_fn))

  @property
  def teacher(self):
    """The distillation stages (`Distiller`, or `NoTeacher`'s that change nothing)."""
    return NoTeacher() if self.distiller is None else self.distiller

  def policy_outputs(self, state, upd: UpdateBatch, sequences):
    """(a new batch with the old log-probs, entropies, reference log-probs and values of its
    tokens, a MoE rollout's routing metrics ({} otherwise))."""
    old_logp, entropy, routed = self.old_logp.outputs(self.fns, state, sequences, upd)
    ref = self.params.reference_params(state)
    ref_logp = old_logp if ref is None else self.fns.policy_stats(ref, sequences)[0]
    values = (self.fns.values(state.critic, sequences) if state.critic is not None
              else jnp.zeros_like(old_logp))
    return upd._replace(old_logp=old_logp, entropy=entropy, ref_logp=ref_logp,
                        old_values=values), routed

  def advantages(self, state, upd: UpdateBatch, rollout: RolloutBatch, sequences):
    """A new batch with the run's advantages and returns (per-turn returns for a multi-turn
    run with `algo.turn_rewards`), with on-policy distillation's term in the reward or the
    advantage when the run has a teacher."""
    for step in self.inputs:   # GDPO's reward components, the optimal token baseline's Σπ²
      upd = step(self, state, upd, rollout, sequences)
    upd = self.teacher.score(upd, sequences)   # the teacher's log-probs (and reward penalty)
    reward = self.teacher.reward(upd)
    adv, returns, _ = compute_advantages(self.specs.advantage, reward, state.kl_coef)
    episodes = self.specs.rollout.episodes
    if episodes is not None and episodes.turn_rewards:   # per-turn returns (multi-turn)
      adv = jax.device_put(turn_reward_advantages(rollout, reward, episodes.gamma,
                                                  self.specs.rollout.n),
                           batch_sharding(self.mesh))
      returns = adv
    return self.teacher.advantages(upd._replace(advantages=adv, returns=returns))

  def prepare(self, state, batch: RolloutBatch, update_key, moments, *, iteration: int = 0):
    """Everything the update needs, as device arrays, the rollout's metrics, and the
    reward-normalisation moments after this batch.

    Returns:
      (`UpdateBatch`, metrics dict, moments)
    """
    # The rollout's arrays on the trainer's rows: global arrays already there stay; host rows
    # (dynamic sampling) and the sampler's own devices' rows are placed here.
    rows = batch_sharding(self.mesh)
    batch = dataclasses.replace(batch, **parallel.move(batch.sequence_arrays(), rows))
    upd = from_rollout(batch, *batch.loss_rows(self._on_truncated()))
    sequences = self.fns.sequences(upd)
    upd, routed = self.policy_outputs(state, upd, sequences)
    upd, moments = self.shaper(upd, batch, moments)
    upd = self.advantages(state, upd, batch, sequences)
    upd = self.weigher(upd, update_key)
    metrics = self.metrics(state, batch, upd)
    metrics.update(routed)
    for step in self.finish:   # staleness metrics, PF-PPO's resampling
      upd, step_metrics = step(self, upd, batch, update_key, iteration)
      metrics.update(step_metrics)
    return upd, metrics, moments

  def after_update(self, state, upd: UpdateBatch, token_outputs):
    """(the batch with the old log-probs the update step returned, when they come from it
    (`forward.FromUpdate`), and the old policy's metrics taken after the update)."""
    return self.old_logp.after_update(upd, token_outputs,
                                      with_ref=self.params.has_reference(state))

  def _on_truncated(self):
    episodes = self.specs.rollout.episodes
    return () if episodes is None else episodes.on_truncated_episode

  def metrics(self, state, batch: RolloutBatch, upd: UpdateBatch) -> dict:
    """The rollout's metrics (`batch.rollout_metrics`), the episodes' (multi-turn), the old policy's,
    on-policy distillation's and the critic's explained variance."""
    mask = upd.float_mask()
    metrics = rollout_metrics(batch, upd.scores, upd.advantages, mask,
                                            upd.mask, state.kl_coef)
    for component in self.components:   # the task's worked mode
      metrics.update(component(batch))
    metrics.update(episode_metrics(batch, upd, with_logp_gap=self.old_logp.logp_gap))
    metrics.update(self.old_logp.rollout_metrics(
        upd, with_ref=self.params.has_reference(state)))
    if upd.teacher_logp is not None:   # on-policy distillation
      metrics.update(distill_metrics(upd))
    if state.critic is not None:
      metrics["critic/explained_variance"] = float(
          explained_variance(upd.old_values, upd.returns, mask))
    return metrics
