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
from rljax.train.update.forward import ForwardFns


def _mask(inputs):
  """Tokens that count: the completion mask of the rows in the baseline (`valid`)."""
  return (inputs["mask"] * inputs["valid"][:, None]).astype(jnp.float32)


@dataclasses.dataclass
class Distiller:
  """The teacher's part of `Preparer.prepare` (made by `make_trainer` when the run has one).

  Attributes:
    spec: the distillation settings (coefficient, mode, teacher only).
    fns: jitted forwards of the teacher's graph definition.
    teacher: the frozen teacher (its parameters on the mesh).
  """

  spec: DistillSpec
  fns: ForwardFns
  teacher: Teacher

  def score(self, inputs, sequences) -> None:
    """Adds to `inputs` the teacher's log-probs of the sampled tokens (`teacher_logp`) and,
    with `distill_mode="reward"`, the per-token penalty c·(log π_s − log π_t)
    (`distill_penalty`, which `update.advantages.compute_advantages` subtracts from the
    reward); with `distill_only` the task's scores in `inputs` become 0, so the penalty is
    the whole reward."""
    teacher_logp = self.fns.policy_stats(self.teacher.params, sequences)[0]
    inputs["teacher_logp"] = teacher_logp
    if self.spec.mode == "reward" and self.spec.coef:
      d = distill_reverse_kl(inputs["old_logp"], teacher_logp, _mask(inputs))
      inputs["distill_penalty"] = self.spec.coef * d
      if self.spec.only:
        inputs["scores"] = jnp.zeros_like(inputs["scores"])

  def advantages(self, adv, inputs):
    """With `distill_mode="advantage"`: the task's advantages (none with `distill_only`)
    plus −c·(log π_s − log π_t) per token; otherwise `adv` unchanged.

    Note: added after the estimator (and its whitening), as the Thinking Machines recipe
    adds it to the task's advantages.
    """
    if self.spec.mode != "advantage" or not self.spec.coef:
      return adv
    distill = distill_advantages(inputs["old_logp"], inputs["teacher_logp"], _mask(inputs),
                                 coef=self.spec.coef)
    return distill if self.spec.only else adv + distill


def distill_metrics(upd) -> dict:
  """`distill/reverse_kl`: the mean over the batch's completion tokens of
  log π_s − log π_t (the k1 estimate of the per-token reverse KL); `distill/teacher_logp`:
  the teacher's mean log-prob of the sampled tokens."""
  mask = upd["completion_mask"].astype(jnp.float32)
  d = distill_reverse_kl(upd["old_logp"], upd["teacher_logp"], mask)
  return {"distill/reverse_kl": float(masked_mean(d, mask)),
          "distill/teacher_logp": float(masked_mean(upd["teacher_logp"], mask))}
