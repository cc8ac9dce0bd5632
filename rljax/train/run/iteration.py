"""One RL iteration: rollout -> score -> old/ref log-probs and values -> advantages -> updates."""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from rljax import parallel
from rljax.data.samplers import UniformSampler
from rljax.ops import kl as kl_ops
from rljax.train.params import policy_params
from rljax.train.rollout import collect
from rljax.train.run.build import Run
from rljax.train.update.epochs import Epochs
from rljax.train.update.forward import ForwardFns
from rljax.train.update.prepare import Preparer


@dataclasses.dataclass
class Trainer:
  """A built run and the compiled pieces of its iteration (made once per run)."""

  run: Run
  fns: ForwardFns
  preparer: Preparer
  epochs: Epochs
  update_step: object

  def compile_count(self) -> int:
    """Programs compiled so far by the forward passes (the teacher's too) and the update step."""
    distiller = self.preparer.distiller
    teacher = distiller.fns.compile_count() if distiller is not None else 0
    return self.fns.compile_count() + self.update_step._cache_size() + teacher


def iteration_keys(rng_data, iteration, sample_stream: int = 0):
  """The iteration's keys for sampling, the update and the greedy baseline: functions of
  (run seed, iteration) alone (`rng_data`: the key data of the run seed, `TrainState.rng`),
  so every arm of an ablation draws the same ones (common
  random numbers); `sample_stream` > 0 gives the sampling key its own stream (an A/A
  control that shares everything but the sampling noise)."""
  # from host data: the keys are uncommitted, usable on the trainer's and the sampler's devices
  base = jax.random.fold_in(jax.random.wrap_key_data(np.asarray(rng_data)), iteration)
  keys = dict(zip(("sample", "update", "greedy"), jax.random.split(base, 3)))
  if sample_stream:
    keys["sample"] = jax.random.fold_in(keys["sample"], sample_stream)
  return keys


def draw_prompts_fn(run: Run, iteration: int):
  """`draw(k, round) -> k prompts`: round 0 from the run's prompt sampler (one call per
  iteration, its state checkpointed with the run); the extra rounds of dynamic sampling
  from (seed, iteration, round) alone under the uniform sampler, so arms with and without
  dynamic sampling see the same prompts in every iteration's first round and after it."""
  prompts = run.task.train_prompts()

  def draw(k, round_=0):
    if round_ == 0 or not isinstance(run.prompt_sampler, UniformSampler):
      index = run.prompt_sampler.sample(k)
    else:
      rng = np.random.default_rng([run.specs.run.seed, _EXTRA_ROUNDS, iteration, round_])
      index = rng.choice(len(prompts), k, replace=len(prompts) < k)
    return [prompts[i] for i in index]
  return draw


_EXTRA_ROUNDS = 0xD5   # folds the stream of dynamic sampling's extra rounds


def feed_back_success(run: Run, prompts, accuracy, n):
  """Per-prompt success rates to the sampler (prioritized sampling tracks them online)."""
  index = np.asarray([run.prompt_index[p.id] for p in prompts])
  run.prompt_sampler.update(index, np.asarray(accuracy).reshape(-1, n).mean(axis=1))


def _adapt_kl(run: Run, state, metrics, rows: int):
  """The adaptive KL controller's next coefficient (Ziegler et al. 2019, arXiv:1909.08593)."""
  s = run.specs.sources
  if s.kl_controller != "adaptive" or not run.params.has_reference(state):
    return state
  ctl = kl_ops.AdaptiveKLController(value=state.kl_coef, target=s.kl_target,
                                    horizon=s.kl_horizon)
  new_coef = ctl.update(metrics.get("kl/to_ref", 0.0), rows).value
  return state._replace(kl_coef=_like(state.kl_coef, new_coef))


@dataclasses.dataclass
class Sampled:
  """A scored rollout batch and the policy version (iteration) that sampled it."""

  batch: object
  stats: dict
  version: int


def sample_now(trainer: Trainer, state, iteration, model) -> Sampled:
  """The synchronous rollout of `iteration`, by the current policy `model`."""
  run = trainer.run
  spec = run.specs.rollout
  keys = iteration_keys(state.rng, iteration, run.specs.run.sample_stream)
  t0 = time.perf_counter()
  batch, stats = collect(run.rollouts, model, draw_prompts_fn(run, iteration),
                         lambda round_: jax.random.fold_in(keys["sample"], round_), spec,
                         greedy_key=keys["greedy"])
  feed_back_success(run, batch.prompts, batch.accuracy, spec.n)
  stats["time/rollout_s"] = time.perf_counter() - t0
  batch.versions = np.full(batch.size, iteration, np.int32)
  return Sampled(batch, stats, iteration)


def rl_iteration(trainer: Trainer, state, iteration, moments, sampled: Sampled):
  """Prepares and consumes one sampled batch; returns (state, metrics, moments, update
  batch)."""
  run = trainer.run
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
