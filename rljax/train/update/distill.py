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


@dataclasses.dataclass
class Distiller:
  """The teacher's stages of `Preparer.prepare` (made by `make_trainer` when the run has
  one): `score` before the advantages, `advantages` after them.

  Attributes:
    spec: the distillation settings (coefficient, mode, teacher only).
    fns: jitted forwards of the teacher's graph definition.
    teacher: the frozen teacher (its parameters on the mesh).
  """

  spec: DistillSpec
  fns: ForwardFns
  teacher: Teacher

  def score(self, upd: UpdateBatch, sequences) -> UpdateBatch:
    """A new batch with the teacher's log-probs of the sampled tokens (`teacher_logp`) and,
    with `distill_mode="reward"`, the per-token penalty c·(log π_s − log π_t)
    (`distill_penalty`, which `update.advantages.compute_advantages` subtracts from the
    reward)."""
    upd = upd._replace(teacher_logp=self.fns.policy_stats(self.teacher.params, sequences)[0])
    if self.spec.mode != "reward" or not self.spec.coef:
      return upd
    return upd._replace(distill_penalty=self.spec.coef * distill_reverse_kl(
        upd.old_logp, upd.teacher_logp, _mask(upd)))

  def reward(self, upd: UpdateBatch) -> UpdateBatch:
    """The batch the advantage estimator sees: with `distill_only` and a penalty in the
    reward, the task's scores are 0 there (the penalty is the whole reward); the batch's
    own `scores` (the metrics') stay."""
    if upd.distill_penalty is None or not self.spec.only:
      return upd
    return upd._replace(scores=jnp.zeros_like(upd.scores))

  def advantages(self, upd: UpdateBatch) -> UpdateBatch:
    """With `distill_mode="advantage"`: a new batch whose advantages are the task's (none
    with `distill_only`) plus −c·(log π_s − log π_t) per token; otherwise `upd`.

    Note: added after the estimator (and its whitening), as the Thinking Machines recipe
    adds it to the task's advantages.
    """
    if self.spec.mode != "advantage" or not self.spec.coef:
      return upd
    distill = distill_advantages(upd.old_logp, upd.teacher_logp, _mask(upd),
                                 coef=self.spec.coef)
    return upd._replace(advantages=distill if self.spec.only else upd.advantages + distill)


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
