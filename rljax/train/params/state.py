"""TrainState: everything that changes during a run, as one pytree; optimizers; placement."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from rljax.models.lora import adapters_off


class TrainState(NamedTuple):
  """Everything that changes during a run, as one pytree (checkpointed whole)."""

  step: jax.Array                # optimizer steps taken
  iteration: jax.Array           # RL iterations completed
  actor: Any                     # nnx.State of the policy parameters
  actor_opt: Any
  critic: Any                    # nnx.State of the critic, or None
  critic_opt: Any
  ref: Any                       # frozen reference policy parameters, or None
  kl_coef: jax.Array             # current KL coefficient (fixed or adaptive controller)
  rng: jax.Array
  skipped_updates: jax.Array     # total non-finite updates skipped
  nonfinite_in_row: jax.Array
  # LoRA (model.lora_rank > 0): the frozen base parameters, and `actor` holds the adapters
  # only. Never donated, returned by the update step or written into step checkpoints.
  base: Any = None


def policy_params(state: TrainState, *, adapters: bool = True):
  """The actor's full parameters (an nnx.State for `nnx.merge(actor_graphdef, ...)`).

  With LoRA, the base merged with the adapters; `adapters=False` zeroes them, which is the
  base model itself: the reference policy of a LoRA run, without a second copy of the base.
  """
  if state.base is None:
    return state.actor
  return nnx.merge_state(state.base, state.actor if adapters else adapters_off(state.actor))


def clipped_adamw(learning_rate, *, b1, b2, weight_decay, grad_clip):
  """Every optimizer of rljax: global-norm gradient clipping (`grad_clip`; 0: off), then AdamW
  (Loshchilov & Hutter 2019, arXiv:1711.05101) at `learning_rate`, a float or an optax
  schedule (`optax.clip_by_global_norm`, `optax.adamw`)."""
  parts = [optax.clip_by_global_norm(grad_clip)] if grad_clip > 0 else []
  parts.append(optax.adamw(learning_rate, b1=b1, b2=b2, weight_decay=weight_decay))
  return optax.chain(*parts)


def make_optimizer(lr, *, warmup_steps, weight_decay, b1, b2, grad_clip):
  """AdamW with linear warm-up and global-norm clipping (optax).

  The learning rate rises linearly from 0 at step 0 to `lr` at step `warmup_steps`; with
  `warmup_steps=0` it is `lr` from the first step (a one-step ramp would make the first
  update a no-op at learning rate 0).
  """
  if warmup_steps <= 0:
    schedule = optax.constant_schedule(lr)
  else:
    schedule = optax.join_schedules(
        [optax.linear_schedule(0.0, lr, warmup_steps), optax.constant_schedule(lr)],
        [warmup_steps])
  return clipped_adamw(schedule, b1=b1, b2=b2, weight_decay=weight_decay, grad_clip=grad_clip)


def place_state(state, mesh):
  """Commits every leaf to `mesh`: sharded parameters keep their NamedSharding, the rest
  (optimizer scalars, step counters, keys) is replicated. Committed inputs with fixed
  shardings are what keeps jit from recompiling after the first iteration."""
  replicated = NamedSharding(mesh, PartitionSpec())

  def put(x):
    sharding = getattr(x, "sharding", None)
    if isinstance(sharding, NamedSharding) and sharding.mesh == mesh:
      return x
    return jax.device_put(x, replicated)
  return jax.tree.map(put, state)


def optimizer_shardings(tx, params):
  """The shardings of `tx.init(params)`: every copy of the parameter tree in it (Adam's
  moments) sharded like the parameters (`optax.tree_map_params`), the rest (step counts)
  replicated on their mesh; None when the parameters are not on a mesh.

  Note: `jax.jit(tx.init)` alone does not do this: the moments are `zeros_like(params)`,
  which reads no parameter value, so jit put them on one device (and `place_state` then
  replicated them on every device of the mesh).
  """
  first = next(iter(jax.tree.leaves(params)), None)
  sharding = getattr(first, "sharding", None)
  if not isinstance(sharding, NamedSharding):
    return None
  replicated = NamedSharding(sharding.mesh, PartitionSpec())
  return optax.tree_map_params(tx, lambda _, p: p.sharding, jax.eval_shape(tx.init, params),
                               params, transform_non_params=lambda _: replicated)


def init_optimizer_state(tx, params):
  """`tx.init` under jit, its moment buffers sharded like the parameters
  (`optimizer_shardings`)."""
  return jax.jit(tx.init, out_shardings=optimizer_shardings(tx, params))(params)
