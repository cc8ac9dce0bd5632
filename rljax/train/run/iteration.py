"""One RL iteration: rollout -> score -> old/ref log-probs and values -> advantages -> updates;
and the compiled pieces of it (`Trainer`), made once the state's placement is known."""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from rljax import parallel
from rljax.ops import kl as kl_ops
from rljax.parallel import batch_sharding
from rljax.train.params import policy_params
from rljax.train.rollout.train_batches import Sampled, iteration_keys
from rljax.train.run.build import Setup
from rljax.train.update.advantages import Distiller
from rljax.train.update.forward import ForwardFns
from rljax.train.update.prepare import Preparer
from rljax.train.update.sft import warm_start
from rljax.train.update.step import Epochs, build_update_step, step_fields


@dataclasses.dataclass
class Trainer:
  """A built run (`setup`) and the compiled pieces of its iteration (made once per run)."""

  setup: Setup
  fns: ForwardFns
  preparer: Preparer
  epochs: Epochs
  update_step: object

  def compile_count(self) -> int:
    """Programs compiled so far by the forward passes (the teacher's too) and the update step."""
    distiller = self.preparer.distiller
    teacher = distiller.fns.compile_count() if distiller is not None else 0
    return self.fns.compile_count() + self.update_step._cache_size() + teacher


def make_trainer(setup: Setup, template) -> Trainer:
  """Forward passes, batch preparation, and the update step whose output shardings are
  those of the placed `template` state (so the second call hits the compilation cache)."""
  specs, params = setup.specs, setup.params
  num_micro = specs.schedule.microbatches
  fns = ForwardFns(specs.loss, params.actor_graphdef, params.critic_graphdef,
                   num_micro=num_micro, mesh=setup.mesh)
  update_step = build_update_step(
      specs.loss, params.actor_graphdef, params.critic_graphdef, params.actor_tx,
      params.critic_tx, num_micro, state_shardings=jax.tree.map(lambda x: x.sharding, template),
      mesh=setup.mesh,
      compiler_options=parallel.low_memory_compiler_options(
          setup.mesh, template, remat=setup.model_cfg.remat))
  epochs = Epochs(update_step=update_step, fns=fns, schedule=specs.schedule,
                  rows_sharding=batch_sharding(setup.mesh), ptx_context=setup.ctx,
                  seed=specs.run.seed, completion_len=specs.rollout.max_new_tokens,
                  fields=step_fields(specs.loss))
  preparer = Preparer.create(specs, fns, params, setup.mesh, setup.ctx.reward_fn,
                             distiller=make_distiller(setup, num_micro))
  return Trainer(setup=setup, fns=fns, preparer=preparer, epochs=epochs, update_step=update_step)


def warm_start_fn(setup: Setup):
  """`warm_start(params, frozen=()) -> params`: the run's cached SFT start."""
  def start(params, frozen=()):
    return warm_start(setup.params.actor_graphdef, setup.ctx, params, spec=setup.specs.sft,
                      seed=setup.specs.run.seed, progress=setup.specs.run.progress,
                      frozen=frozen)
  return start


def make_distiller(setup: Setup, num_micro: int) -> Distiller | None:
  """On-policy distillation's teacher side: a jitted forward of the teacher's own graph
  definition (micro-batched and packed like the policy's), or None without a teacher."""
  teacher = setup.params.teacher
  if teacher is None:
    return None
  fns = ForwardFns(setup.specs.loss, teacher.graphdef, None, num_micro=num_micro,
                   mesh=setup.mesh)
  return Distiller(spec=setup.specs.distill, fns=fns, teacher=teacher)


def _adapt_kl(setup: Setup, state, metrics, rows: int):
  """The adaptive KL controller's next coefficient (Ziegler et al. 2019, arXiv:1909.08593)."""
  s = setup.specs.sources
  if s.kl_controller != "adaptive" or not setup.params.has_reference(state):
    return state
  ctl = kl_ops.AdaptiveKLController(value=state.kl_coef, target=s.kl_target,
                                    horizon=s.kl_horizon)
  new_coef = ctl.update(metrics.get("kl/to_ref", 0.0), rows).value
  return state._replace(kl_coef=_like(state.kl_coef, new_coef))


def rl_iteration(trainer: Trainer, state, iteration, moments, sampled: Sampled):
  """Prepares and consumes one sampled batch; returns (state, metrics, moments, update
  batch)."""
  run = trainer.setup
  keys = iteration_keys(state.rng, iteration, run.specs.run.sample_stream)
  t1 = time.perf_counter()
  upd, metrics, moments = trainer.preparer.prepare(state, sampled.batch, keys["update"],
                                                   moments, iteration=iteration)
  train_actor = iteration >= run.specs.schedule.critic_warmup_iterations
  state, update_metrics, token_outputs = trainer.epochs.run(
      state, upd, keys["update"], train_actor=train_actor, iteration=iteration)
  upd, old_policy = trainer.preparer.after_update(state, upd, token_outputs)
  metrics.update(old_policy)
  state = _adapt_kl(run, state, metrics, upd.mask.shape[0])
  t2 = time.perf_counter()
  metrics.update(sampled.stats)
  metrics.update(update_metrics)
  metrics.update({"time/update_s": t2 - t1,
                  "time/tokens_per_s": float(np.sum(sampled.batch.lengths))
                  / max(sampled.stats["time/generate_s"], 1e-9)})
  state = state._replace(iteration=_like(state.iteration, iteration + 1))
  return state, metrics, moments, upd


def save_analysis_batch(fns: ForwardFns, state, upd, path):
  """The last rollout batch with the updated policy's log-probs, for `rljax.analysis`
  (the notebook's trick-impact view on a real batch)."""
  logp, _ = fns.policy_stats(policy_params(state), fns.sequences(upd))
  arrays = {"logp": logp, "old_logp": upd.old_logp, "entropy": upd.entropy,
            "advantages": upd.advantages, "mask": upd.mask, "scores": upd.scores,
            "truncated": upd.truncated, "tokens": upd.tokens}
  if upd.reward_components is not None:   # GDPO: the unweighted rewards it normalised, [B, K]
    arrays["reward_components"] = upd.reward_components
  arrays = parallel.gather(arrays)   # a collective: every process calls this
  if parallel.is_primary():
    np.savez(path, **arrays)


def _like(old, value):
  """`value` with the dtype and sharding of `old` (keeps the update step's cache warm)."""
  return jax.device_put(jnp.asarray(value, old.dtype), old.sharding)
