"""On-policy distillation in the batch preparation: the frozen teacher scores the sampled
tokens, and its per-token reverse KL enters the advantage or the reward (`rljax.ops.distill`,
`algo.distill_*`).

The teacher's log-probs come from a jitted forward of its own graph definition (a second
`ForwardFns`: same micro-batches, packing and temperature as the policy's forwards). The
student's side is the batch's old log-probs (the sampling policy's, as the policy loss's
ratio is taken against them).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from rljax.ops.distill import distill_advantages, distill_reverse_kl
from rljax.ops.stats import masked_mean
from rljax.train.config.specs import DistillSpec
from rljax.train.params import Teacher
from rljax.train.update.batch import UpdateBatch
from rljax.train.update.forward import ForwardFns


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
    return upd._replace(distill_penalty=self.spec.coef * distill_reverse_kl(
        upd.old_logp, upd.teacher_logp, _mask(upd)))

  def reward(self, upd: UpdateBatch) -> UpdateBatch:
    """With `distill_only`, the task's scores are 0 for the estimator (the penalty is the
    whole reward); the batch's own `scores` (the metrics') stay."""
    if not self.spec.only:
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
                                 coef=self.spec.coef)
    return upd._replace(advantages=distill if self.spec.only else upd.advantages + distill)


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
    self.term = DISTILL_MODES[self.spec.mode](self.spec)

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
