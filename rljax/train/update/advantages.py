"""From scores, KL and values to per-token advantages, with the estimator the run names, and
on-policy distillation's term in the reward or the advantage (`Distiller`).

Group estimators see the rollout as `[P, G]` (P prompts, G samples, prompt-major rows, as
`rljax.sampling.generate` returns them) and come from the registry
`rljax.ops.estimators.ADVANTAGE_ESTIMATORS`. Token estimators (GAE, REINFORCE++) see
per-token rewards `r_t = 1[t = last]·score − β·KL_t`. For sequence-level estimators the
KL penalty, when placed in the reward, is summed over the sequence and subtracted from the
score before the baseline (TRL's RLOO does the same). On-policy distillation's per-token
penalty c·(log π_s − log π_t) (`algo.distill_mode="reward"`) enters the same way, with the
teacher in place of the reference.

Distillation (`rljax.ops.distill`, `algo.distill_*`): the frozen teacher scores the sampled
tokens with a jitted forward of its own graph definition (a second `ForwardFns`: same
micro-batches, packing and temperature as the policy's forwards), and its per-token reverse
KL enters the reward or the advantage. The student's side is the batch's old log-probs (the
sampling policy's, as the policy loss's ratio is taken against them).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from rljax.ops import advantages as adv_ops
from rljax.ops import advantages_group
from rljax.ops import kl as kl_ops
from rljax.ops.distill import distill_advantages, distill_reverse_kl
from rljax.ops.estimators import ADVANTAGE_ESTIMATORS, GroupInputs, sequence_advantages
from rljax.ops.stats import masked_mean
from rljax.train.config.specs import AdvantageSpec, DistillSpec
from rljax.train.params import Teacher
from rljax.train.update.batch import UpdateBatch
from rljax.train.update.forward import ForwardFns


def gdpo_terms(reward_fn):
  """(names, weights) of the rewards GDPO normalises one by one: every weighted component
  of the run's reward (`rljax.rewards.base.Composite`), plus "shaping" (weight 1: what the
  length and repetition penalties add)."""
  terms = [(name, w) for name, _, w in reward_fn.terms if w != 0]
  return tuple(n for n, _ in terms) + ("shaping",), tuple(w for _, w in terms) + (1.0,)


def _to_groups(x, g):
  return x.reshape(-1, g, *x.shape[1:])


def _minus_penalty(seq_scores, penalty_bt):
  """Sequence scores less the sum of a per-token penalty (on-policy distillation's)."""
  return seq_scores if penalty_bt is None else seq_scores - jnp.sum(penalty_bt, axis=1)


def _gae(spec: AdvantageSpec, batch, rewards_bt, mask, seq_scores):
  return adv_ops.gae(rewards_bt, batch.old_values, mask, gamma=spec.gamma, lam=spec.lam)


def _reinforce_pp(spec: AdvantageSpec, batch, rewards_bt, mask, seq_scores):
  advantages = adv_ops.reinforce_pp_advantages(rewards_bt, mask, gamma=spec.gamma)
  return advantages, advantages


def _optimal_token_baseline(spec: AdvantageSpec, batch, rewards_bt, mask, seq_scores):
  # G_t: reward-to-go of the outcome score (minus the KL penalties still ahead)
  g = spec.group_size
  returns = jnp.flip(jnp.cumsum(jnp.flip(rewards_bt * mask, 1), axis=1), 1) * mask
  advantages = advantages_group.optimal_token_baseline_advantages(
      _to_groups(returns, g), _to_groups(batch.sampled_logp, g),
      _to_groups(batch.sum_sq, g), _to_groups(mask, g), **dict(spec.kwargs)).reshape(mask.shape)
  return advantages, returns


def _reinforce_pp_baseline(spec: AdvantageSpec, batch, rewards_bt, mask, seq_scores):
  g = spec.group_size
  advantages = adv_ops.reinforce_pp_baseline_advantages(
      seq_scores.reshape(-1, g), _to_groups(mask, g)).reshape(mask.shape)
  return advantages, advantages


# The token-level estimators (`rljax.ops.estimators`, level "token"): estimate(spec, batch,
# per-token rewards [B,T], mask [B,T], sequence scores [B]) -> (advantages, returns)
TOKEN_ESTIMATORS = {"gae": _gae, "reinforce_pp": _reinforce_pp,
                    "optimal_token_baseline": _optimal_token_baseline,
                    "reinforce_pp_baseline": _reinforce_pp_baseline}


def _token_level(estimate, spec: AdvantageSpec, batch, scores, kl_bt, mask, kl_coef,
                 penalty_bt=None):
  """(advantages, returns) of a token-level estimator (`estimate`, a `TOKEN_ESTIMATORS`
  entry) from the per-token rewards."""
  rewards_bt = kl_ops.kl_penalized_rewards(scores, kl_bt, mask, beta=kl_coef)
  if penalty_bt is not None:   # on-policy distillation in the reward: r_t −= c·d_t
    rewards_bt = rewards_bt - penalty_bt
  # the sequence's score less its KL (and distillation) penalties (unused ones are not
  # computed: this runs under `jax.jit`)
  seq_scores = _minus_penalty(scores - kl_coef * jnp.sum(kl_bt, axis=1), penalty_bt)
  return estimate(spec, batch, rewards_bt, mask, seq_scores)


def _sequence_level(spec: AdvantageSpec, batch, scores, kl_bt, mask, kl_coef, penalty_bt=None):
  """Advantages of a sequence-level estimator (or GDPO), broadcast over each row's tokens."""
  g = spec.group_size
  valid_pg = batch.valid.reshape(-1, g)
  if spec.reward_weights:   # GDPO; validation allows it with "grpo" and no KL in reward
    comps = batch.reward_components
    adv_b = advantages_group.gdpo_advantages(
        _to_groups(comps, g), jnp.asarray(spec.reward_weights), eps=spec.adv_eps, mask_bg=valid_pg,
        whiten_over=spec.gdpo_whiten_over,
        lengths_bg=jnp.sum(batch.completion_mask, axis=1).reshape(-1, g)).reshape(-1)
  else:
    seq_scores = _minus_penalty(scores - kl_coef * jnp.sum(kl_bt, axis=1), penalty_bt)
    greedy = batch.greedy_scores
    inputs = GroupInputs(mask_bg=valid_pg,
                         lengths_bg=jnp.sum(batch.completion_mask, axis=1).reshape(-1, g),
                         greedy_bg=None if greedy is None else greedy.reshape(-1, g))
    adv_b = sequence_advantages(spec.advantage, spec.kwargs, seq_scores.reshape(-1, g),
                                inputs).reshape(-1)
  advantages = jnp.broadcast_to(adv_b[:, None], mask.shape) * mask
  return advantages, advantages


# Every registered estimator's estimate(spec, batch, scores, kl_bt, mask, kl_coef, penalty_bt)
# -> (advantages, returns), by name: the token-level ones (`TOKEN_ESTIMATORS`) from per-token
# rewards, the sequence-level ones from each group's scores
ESTIMATES = ({name: _sequence_level for name in ADVANTAGE_ESTIMATORS}
             | {name: functools.partial(_token_level, fn) for name, fn in TOKEN_ESTIMATORS.items()})


@functools.partial(jax.jit, static_argnums=0)
def compute_advantages(spec: AdvantageSpec, batch, kl_coef):
  """Advantages [B,T] and returns [B,T] (returns only meaningful for GAE).

  Args:
    spec: static choices.
    batch: an `UpdateBatch` with scores [B], valid [B] (sequences that count),
      completion_mask [B,T], old_logp, ref_logp [B,T], old_values [B,T]; as the run needs,
      greedy_scores [B], reward_components [B,K], sampled_logp and sum_sq [B,T] (the optimal
      token baseline), distill_penalty [B,T] (on-policy distillation in the reward:
      c·(log π_s − log π_t), subtracted from each token's reward, or its sum from a
      sequence's score).
    kl_coef: current β (scalar array).
  Returns:
    (advantages [B,T], returns [B,T], kl_bt [B,T] or zeros).
  """
  mask = batch.completion_mask * batch.valid[:, None]
  scores = batch.scores.astype(jnp.float32)
  kl_bt = jnp.zeros(mask.shape, jnp.float32)
  if spec.kl_in_reward:
    kl_bt = kl_ops.kl_estimate(batch.old_logp, batch.ref_logp, spec.kl_estimator) * mask
  penalty_bt = batch.distill_penalty
  if penalty_bt is not None:
    penalty_bt = penalty_bt * mask
  estimate = ESTIMATES[spec.advantage]
  advantages, returns = estimate(spec, batch, scores, kl_bt, mask, kl_coef, penalty_bt)
  if spec.whiten_advantages:
    advantages = adv_ops.whiten(advantages, mask)
  return advantages * mask, returns * mask, kl_bt


def _mask(upd: UpdateBatch):
  """Tokens that count: the completion mask of the rows in the baseline (`valid`)."""
  return (upd.completion_mask * upd.valid[:, None]).astype(jnp.float32)


@dataclasses.dataclass(frozen=True)
class InReward:
  """`distill_mode="reward"`: the per-token penalty c·(log π_s − log π_t) enters the reward
  (`distill_penalty`, which `update.advantages.compute_advantages` subtracts from it)."""

  spec: DistillSpec

  def penalty(self, upd: UpdateBatch) -> UpdateBatch:
    """A new batch with the penalty (zeros for c = 0)."""
    return upd._replace(distill_penalty=self.spec.distill_coef * distill_reverse_kl(
        upd.old_logp, upd.teacher_logp, _mask(upd)))

  def reward(self, upd: UpdateBatch) -> UpdateBatch:
    """With `distill_only`, the task's scores are 0 for the estimator (the penalty is the
    whole reward); the batch's own `scores` (the metrics') stay."""
    if not self.spec.distill_only:
      return upd
    return upd._replace(scores=jnp.zeros_like(upd.scores))

  def advantages(self, upd: UpdateBatch) -> UpdateBatch:
    """`upd`: the term is in the reward."""
    return upd


@dataclasses.dataclass(frozen=True)
class InAdvantage:
  """`distill_mode="advantage"`: −c·(log π_s − log π_t) per token is added to the task's
  advantages (or replaces them with `distill_only`).

  Note: added after the estimator (and its whitening), as the Thinking Machines recipe
  adds it to the task's advantages.
  """

  spec: DistillSpec

  def penalty(self, upd: UpdateBatch) -> UpdateBatch:
    """`upd`: nothing enters the reward."""
    return upd

  def reward(self, upd: UpdateBatch) -> UpdateBatch:
    """`upd`."""
    return upd

  def advantages(self, upd: UpdateBatch) -> UpdateBatch:
    """A new batch whose advantages are the task's (none with `distill_only`) plus the
    teacher's term (zeros for c = 0)."""
    distill = distill_advantages(upd.old_logp, upd.teacher_logp, _mask(upd),
                                 coef=self.spec.distill_coef)
    return upd._replace(advantages=distill if self.spec.distill_only else upd.advantages + distill)


# Where the teacher's term enters, by `algo.distill_mode`
DISTILL_MODES = {"reward": InReward, "advantage": InAdvantage}


@dataclasses.dataclass
class Distiller:
  """The teacher's stages of `Preparer.prepare` (made by `make_trainer` when the run has
  one): `score` before the advantages, `reward` the estimator's scores, `advantages` after
  them; where the term enters is the `DISTILL_MODES` entry of the run's mode, chosen once.

  Attributes:
    spec: the distillation settings (coefficient, mode, teacher only).
    fns: jitted forwards of the teacher's graph definition.
    teacher: the frozen teacher (its parameters on the mesh).
  """

  spec: DistillSpec
  fns: ForwardFns
  teacher: Teacher
  term: InReward | InAdvantage = dataclasses.field(init=False)

  def __post_init__(self):
    self.term = DISTILL_MODES[self.spec.distill_mode](self.spec)

  def score(self, upd: UpdateBatch, sequences) -> UpdateBatch:
    """A new batch with the teacher's log-probs of the sampled tokens (`teacher_logp`) and,
    with `distill_mode="reward"`, the per-token penalty (`distill_penalty`)."""
    upd = upd._replace(teacher_logp=self.fns.policy_stats(self.teacher.params, sequences)[0])
    return self.term.penalty(upd)

  def reward(self, upd: UpdateBatch) -> UpdateBatch:
    """The batch the advantage estimator sees (`InReward.reward`)."""
    return self.term.reward(upd)

  def advantages(self, upd: UpdateBatch) -> UpdateBatch:
    """The batch with the teacher's term in its advantages (`InAdvantage.advantages`)."""
    return self.term.advantages(upd)


@dataclasses.dataclass(frozen=True)
class NoTeacher:
  """A run without a teacher: both stages leave the batch as it is."""

  def score(self, upd: UpdateBatch, sequences) -> UpdateBatch:
    """`upd`."""
    return upd

  def reward(self, upd: UpdateBatch) -> UpdateBatch:
    """`upd`."""
    return upd

  def advantages(self, upd: UpdateBatch) -> UpdateBatch:
    """`upd`."""
    return upd


def distill_metrics(upd: UpdateBatch) -> dict:
  """`distill/reverse_kl`: the mean over the batch's completion tokens of
  log π_s − log π_t (the k1 estimate of the per-token reverse KL); `distill/teacher_logp`:
  the teacher's mean log-prob of the sampled tokens."""
  mask = upd.float_mask()
  d = distill_reverse_kl(upd.old_logp, upd.teacher_logp, mask)
  return {"distill/reverse_kl": float(masked_mean(d, mask)),
          "distill/teacher_logp": float(masked_mean(upd.teacher_logp, mask))}
