"""The compiled pieces of a run's iteration, made once the state's placement is known."""

from __future__ import annotations

import jax

from rljax.parallel import batch_sharding
from rljax.train.run.build import Run
from rljax.train.run.iteration import Trainer
from rljax.train.update.distill import Distiller
from rljax.train.update.epochs import Epochs, step_fields
from rljax.train.update.forward import ForwardFns
from rljax.train.update.prepare import Preparer
from rljax.train.update.sft import warm_start
from rljax.train.update.step import build_update_step


def make_trainer(run: Run, template) -> Trainer:
  """Forward passes, batch preparation, and the update step whose output shardings are
  those of the placed `template` state (so the second call hits the compilation cache)."""
  specs, params = run.specs, run.params
  num_micro = specs.schedule.microbatches
  fns = ForwardFns(specs.loss, params.actor_graphdef, params.critic_graphdef,
                   num_micro=num_micro, mesh=run.mesh)
  update_step = build_update_step(
      specs.loss, params.actor_graphdef, params.critic_graphdef, params.actor_tx,
      params.critic_tx, num_micro, state_shardings=jax.tree.map(lambda x: x.sharding, template),
      mesh=run.mesh)
  epochs = Epochs(update_step=update_step, fns=fns, schedule=specs.schedule,
                  rows_sharding=batch_sharding(run.mesh), ptx_context=run.ctx,
                  seed=specs.run.seed, completion_len=specs.rollout.max_new_tokens,
                  fields=step_fields(specs.loss))
  preparer = Preparer.create(specs, fns, params, run.mesh, run.ctx.reward_fn,
                             distiller=make_distiller(run, num_micro))
  return Trainer(run=run, fns=fns, preparer=preparer, epochs=epochs, update_step=update_step)


def warm_start_fn(run: Run):
  """`warm_start(params, frozen=()) -> params`: the run's cached SFT start."""
  def start(params, frozen=()):
    return warm_start(run.params.actor_graphdef, run.ctx, params, spec=run.specs.sft,
                      seed=run.specs.run.seed, progress=run.specs.run.progress, frozen=frozen)
  return start


def make_distiller(run: Run, num_micro: int) -> Distiller | None:
  """On-policy distillation's teacher side: a jitted forward of the teacher's own graph
  definition (micro-batched and packed like the policy's), or None without a teacher."""
  teacher = run.params.teacher
  if teacher is None:
    return None
  fns = ForwardFns(run.specs.loss, teacher.graphdef, None, num_micro=num_micro, mesh=run.mesh)
  return Distiller(spec=run.specs.distill, fns=fns, teacher=teacher)
