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
  parts = [optax.clip_by_global_norm(grad_clip)] if grad_clip > 0 else []
  parts.append(optax.adamw(schedule, b1=b1, b2=b2, weight_decay=weight_decay))
  return optax.chain(*parts)


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


def init_optimizer_state(tx, params):
  """`tx.init` under jit, so moment buffers inherit the parameters' shardings."""
  return jax.jit(tx.init)(params)
