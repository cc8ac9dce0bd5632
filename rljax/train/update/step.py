"""Consuming one update batch: `epochs × minibatches` update steps over shuffled rows
(`Epochs`), each a call of the jit-compiled update step:
`update_step(state, minibatch) -> (state, metrics)` (`metrics[objective.TOKEN_OUTPUTS]`:
the step's per-token outputs, {} for most runs).

The minibatch is split into micro-batches scanned with `lax.scan`; gradients of the
globally normalised micro-losses are summed, so the update does not depend on the
split. A non-finite gradient norm skips the update (parameters and optimizer state
unchanged) and is counted.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from rljax import parallel
from rljax.train.config.specs import LossSpec, ScheduleSpec
from rljax.train.params.state import TrainState
from rljax.train.rollout.context import demonstration_batch
from rljax.train.update import objective
from rljax.train.update.batch import UpdateBatch
from rljax.train.update.forward import ForwardFns, split_micro


def _apply(tx, grads, opt_state, params, enabled):
  """One optimizer step, or no change at all when `enabled` is False.

  A `lax.cond`, not a select of the new or the old values: to select, XLA keeps the old
  parameters and moments beside the new ones, and on the CPU it copied Adam's moments
  before the forward pass to do so (Qwen2.5-0.5B update: 8,529 -> 7,745 MB of
  temporaries, `tests/test_train_update_memory.py`). Same values either way.
  """
  def step(args):
    grads, opt_state, params = args
    updates, new_opt = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), new_opt

  return jax.lax.cond(enabled, step, lambda args: (args[2], args[1]),
                      (grads, opt_state, params))


def accumulate_gradients(micro, params, minibatch, denom, base, num_micro):
  """Sums `micro`'s gradients, losses and metric sums over `num_micro` micro-batches in a
  `lax.scan`; returns (grads, loss, metric sums, per-token outputs [num_micro, b, ...]:
  `objective.TOKEN_OUTPUTS`, {} for most runs)."""
  grad_fn = jax.value_and_grad(micro, has_aux=True)

  def body(carry, mb):
    grads, loss, sums = carry
    (micro_loss, micro_metrics), micro_grads = grad_fn(params, mb, denom, base)
    per_token = micro_metrics.pop(objective.TOKEN_OUTPUTS)
    sums = jax.tree.map(jnp.add, sums, micro_metrics)
    return (jax.tree.map(jnp.add, grads, micro_grads), loss + micro_loss, sums), per_token

  micro_batches = split_micro(minibatch, num_micro)
  first = jax.tree.map(lambda x: x[0], micro_batches)
  _, metric_shape = jax.eval_shape(lambda: micro(params, first, denom, base))
  metric_shape.pop(objective.TOKEN_OUTPUTS)
  init = (jax.tree.map(jnp.zeros_like, params), jnp.zeros(()),
          jax.tree.map(jnp.zeros_like, metric_shape))
  (grads, loss, sums), per_token = jax.lax.scan(body, init, micro_batches)
  return grads, loss, sums, per_token


def apply_gradients(state: TrainState, grads, loss, actor_tx, critic_tx, train_actor):
  """The optimizer steps of actor and critic, or no change when the loss or a gradient
  norm is not finite (counted); returns (state, gradient norms, finite)."""
  actor_norm = optax.tree.norm(grads[0])
  critic_norm = optax.tree.norm(grads[1]) if state.critic is not None else jnp.zeros(())
  finite = jnp.isfinite(loss) & jnp.isfinite(actor_norm) & jnp.isfinite(critic_norm)
  actor, actor_opt = _apply(actor_tx, grads[0], state.actor_opt, state.actor,
                            finite & train_actor)
  critic, critic_opt = state.critic, state.critic_opt
  if state.critic is not None:
    critic, critic_opt = _apply(critic_tx, grads[1], critic_opt, critic, finite)
  new_state = state._replace(
      step=state.step + finite.astype(jnp.int32), actor=actor, actor_opt=actor_opt,
      critic=critic, critic_opt=critic_opt,
      skipped_updates=state.skipped_updates + (~finite).astype(jnp.int32),
      nonfinite_in_row=jnp.where(finite, 0, state.nonfinite_in_row + 1))
  return new_state, (actor_norm, critic_norm), finite


def build_update_step(spec, actor_graphdef, critic_graphdef, actor_tx, critic_tx, num_micro,
                      *, state_shardings=None, mesh=None, compiler_options=None):
  """Returns a jitted `update_step(state, minibatch, train_actor) -> (state, metrics)`.

  With `state_shardings` (the shardings of a placed TrainState), the new state keeps
  exactly those shardings, so the second call hits the compilation cache. With `mesh`, the
  step is traced under it (`rljax.parallel.traced_on`). `compiler_options` go to `jax.jit`
  (`rljax.parallel.low_memory_compiler_options` for a big state on CPU).

  The update never reads the reference parameters: the returned function hands the
  jitted step the state without `ref` and puts the same `ref` back into the new state,
  so they may live in host memory (`algo.reference_offload`) and are never donated.
  A LoRA base (`state.base`) is passed as a separate, non-donated argument and is not
  returned: the step differentiates and updates the adapters only.
  `update_step.lower(...)` and `update_step._cache_size()` are the jitted step's.
  """

  def micro(params, minibatch, denom, base):
    actor_params, critic_params = params
    # LoRA: the frozen base enters as an argument; only the adapters are differentiated
    actor = nnx.merge(actor_graphdef, actor_params, *([] if base is None else [base]))
    critic = nnx.merge(critic_graphdef, critic_params) if critic_params is not None else None
    return objective.micro_loss(spec, actor, critic, minibatch, denom)

  out_shardings = None
  if state_shardings is not None:
    out_shardings = (state_shardings._replace(ref=None, base=None),
                     NamedSharding(mesh, PartitionSpec()))

  def jitted_step(state: TrainState, base, minibatch, train_actor):
    denom = objective.minibatch_denominators(spec, minibatch)
    grads, loss, sums, per_token = accumulate_gradients(
        micro, (state.actor, state.critic), minibatch, denom, base, num_micro)
    new_state, (actor_norm, critic_norm), finite = apply_gradients(
        state, grads, loss, actor_tx, critic_tx, train_actor)
    metrics = {k: v / denom["tokens"] for k, v in sums.items()}
    metrics.update(loss=loss, grad_norm=actor_norm, critic_grad_norm=critic_norm,
                   skipped=(~finite).astype(jnp.float32))
    # [num_micro, b, T] -> [B, T], the minibatch's row order
    metrics[objective.TOKEN_OUTPUTS] = jax.tree.map(
        lambda x: x.reshape((-1,) + x.shape[2:]), per_token)
    return new_state, metrics

  # traced under the mesh, so that model.attention="auto" picks splash on a TPU slice
  jitted_step = jax.jit(parallel.traced_on(mesh, jitted_step), donate_argnums=(0,),
                        out_shardings=out_shardings,
                        compiler_options=compiler_options)

  def update_step(state: TrainState, minibatch, train_actor):
    new_state, metrics = jitted_step(state._replace(ref=None, base=None), state.base,
                                     minibatch, train_actor)
    return new_state._replace(ref=state.ref, base=state.base), metrics

  update_step.lower = lambda state, *args: jitted_step.lower(
      state._replace(ref=None, base=None), state.base, *args)
  update_step._cache_size = jitted_step._cache_size
  return update_step


UPDATE_KEYS = ("prompt_tokens", "prompt_mask", "tokens", "mask", "old_logp", "ref_logp",
               "advantages", "returns", "old_values", "token_weights", "is_weights", "rng")


def step_fields(loss: LossSpec) -> tuple:
  """The `UpdateBatch` fields the update step reads: `UPDATE_KEYS`, the sampler's log-probs
  (the behaviour policy of decoupled PPO) and its experts (routing replay)."""
  behaviour = ("sampler_logp",) if loss.decoupled_cap is not None else ()
  replay = ("routes",) if loss.routing_replay else ()
  return UPDATE_KEYS + behaviour + replay


@functools.partial(jax.jit, static_argnums=2)
def take_rows(tree, index, sharding):
  """Rows `index` of every array in `tree`, as one program (every process runs the same
  one, whatever the arrays' layout over processes), placed with `sharding`."""
  return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x[index], sharding), tree)


def ptx_batch(ctx, size: int, *, seed, completion_len: int):
  """Demonstrations mixed into the RL loss (InstructGPT's PPO-ptx, arXiv:2203.02155,
  Eq. 2), drawn reproducibly from `seed` = (run seed, iteration, epoch, minibatch)."""
  prompts = ctx.task.train_prompts()
  rng = np.random.default_rng([seed[0], 7, *seed[1:]])
  chosen = [prompts[i] for i in rng.integers(0, len(prompts), size)]
  return demonstration_batch(ctx, chosen, completion_len)


@dataclasses.dataclass
class Epochs:
  """The update steps of one iteration (`algo.epochs` × `algo.minibatches`)."""

  update_step: object
  fns: ForwardFns
  schedule: ScheduleSpec
  rows_sharding: object
  ptx_context: object = None   # the RolloutContext of ptx demonstrations (algo.ptx_coef)
  fields: tuple = UPDATE_KEYS   # what the update step reads (`step_fields`)
  seed: int = 0
  completion_len: int = 0

  def minibatch(self, state, upd: UpdateBatch, index, *, iteration, epoch, m):
    """The update step's input for rows `index` of `upd`."""
    rows = {k: getattr(upd, k) for k in self.fields}
    minibatch = take_rows(rows, jnp.asarray(index), self.rows_sharding)
    minibatch.update(self.fns.pack(upd.extents(), upd.tokens.shape[1],
                                   upd.prompt_tokens.shape[1], np.asarray(index)))
    minibatch["kl_coef"] = jnp.copy(state.kl_coef)   # own buffer: the state is donated
    if self.schedule.ptx_coef:
      minibatch["ptx"] = ptx_batch(self.ptx_context, len(index),
                                   seed=(self.seed, iteration, epoch, m),
                                   completion_len=self.completion_len)
    return minibatch

  def run(self, state, upd: UpdateBatch, update_key, *, train_actor: bool, iteration: int):
    """Returns (state, mean metrics over the steps as `update/<name>`, the per-token outputs
    of the last update step in `upd`'s row order). The step's per-token outputs are {}, or
    the old log-probs taken from its own forward pass (`forward.FromUpdate`: one
    minibatch); `upd` is not changed."""
    s = self.schedule
    b = upd.mask.shape[0]
    per_mb = b // s.minibatches
    steps, token_outputs = [], {}
    for epoch in range(s.epochs):
      perm = np.asarray(jax.random.permutation(jax.random.fold_in(update_key, epoch), b))
      for m in range(s.minibatches):
        index = perm[m * per_mb:(m + 1) * per_mb]
        minibatch = self.minibatch(state, upd, index, iteration=iteration, epoch=epoch, m=m)
        state, metrics = self.update_step(state, minibatch, jnp.asarray(train_actor))
        per_token = metrics.pop(objective.TOKEN_OUTPUTS)   # rows in `index` order
        token_outputs = {k: v[np.argsort(index)] for k, v in per_token.items()}
        steps.append({k: float(v) for k, v in metrics.items()})
    return state, {f"update/{k}": sum(m[k] for m in steps) / len(steps)
                   for k in steps[0]}, token_outputs
