"""TrainState: everything that changes during a run, as one pytree; optimizers; placement;
and its checkpoints (`Checkpointer`).

Checkpoints use orbax-checkpoint: the whole TrainState plus host-side state as JSON. Orbax
writes each step into a temporary directory and renames it when complete, so a half-written
checkpoint is never picked up. On restore, an unreadable newest step is reported and the
previous one is used. A checkpoint written with one module per decoder layer (before
`ModelConfig.scan_layers`, or with it off) restores into a scanned model, its layers stacked
(`rljax.models.stack.checkpoint_layout`), and the other way round. Under `jax.distributed`
every process calls `save` / `restore_latest` (orbax writes and reads collectively; each
process its shards).
"""

from __future__ import annotations

import logging
import pathlib
from typing import Any, NamedTuple

import jax
import optax
import orbax.checkpoint as ocp
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from rljax import parallel
from rljax.models.lora import adapters_off
from rljax.models.stack import restore_in_layout


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


log = logging.getLogger(__name__)


class Checkpointer:
  """Saves / restores `(train_state, host_state)` under `<run_dir>/checkpoints/<step>`."""

  def __init__(self, run_dir, *, keep=3):
    self.directory = pathlib.Path(run_dir).absolute() / "checkpoints"
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                           enable_async_checkpointing=True)
    # handlers named up front: a step's metadata is then readable before any restore
    self.manager = ocp.CheckpointManager(self.directory, options=options, item_handlers={
        "state": ocp.StandardCheckpointHandler(), "host": ocp.JsonCheckpointHandler()})

  def save(self, step, state, host_state):
    """Starts an (asynchronous) save of `state` (a pytree) and JSON-able `host_state`."""
    self.manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), host=ocp.args.JsonSave(host_state)))

  def wait(self):
    self.manager.wait_until_finished()

  def steps(self):
    return sorted(self.manager.all_steps())

  def restore_latest(self, abstract_state):
    """Restores the newest readable checkpoint.

    Args:
      abstract_state: a pytree with the structure, shapes, dtypes and shardings to
        restore into (e.g. the freshly initialised state).
    Returns:
      (step, state, host_state) or None when there is no readable checkpoint.
    """
    target = jax.tree.map(ocp.utils.to_shape_dtype_struct, abstract_state)
    for step in reversed(self.steps()):
      out, failure = None, None
      try:
        out = self._restore_step(step, target)
      except Exception as err:  # noqa: BLE001 - any unreadable checkpoint falls back
        failure = f"{type(err).__name__}: {err}"
      # Under jax.distributed all processes fall back together if any one failed.
      if not parallel.any_process(failure is not None):
        return step, *out
      log.warning("checkpoint step %s is unreadable (%s); falling back to an older one",
                  step, failure or "on another process")
      print(f"[rljax] checkpoint {step} unreadable "
            f"({failure.split(':')[0] if failure else 'on another process'}); "
            "falling back to the previous one")
    return None

  def _restore_step(self, step, target):
    """(state, host state) of checkpoint `step`, the state in `target`'s layer layout
    (checkpoints written before layers were scanned are stacked on restore)."""
    host = []

    def restore(state_target):
      out = self.manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(state_target), host=ocp.args.JsonRestore()))
      host.append(out.host)
      return out.state
    state = restore_in_layout(restore, self.manager.item_metadata(step)["state"], target)
    return state, host[0]

  @property
  def frozen_directory(self) -> pathlib.Path:
    return self.directory.parent / "lora_base"

  def save_frozen(self, tree):
    """Writes parameters that never change during the run (a LoRA run's base) once, beside
    the step checkpoints, which then hold only what trains (nothing to write: None)."""
    if tree is None or self.frozen_directory.exists():
      return
    with ocp.StandardCheckpointer() as ckpt:
      ckpt.save(self.frozen_directory, tree)

  def restore_frozen(self, abstract_tree):
    """The tree `save_frozen` wrote, or None when there is none (or none is expected)."""
    if abstract_tree is None or not self.frozen_directory.exists():
      return None
    target = jax.tree.map(ocp.utils.to_shape_dtype_struct, abstract_tree)
    with ocp.StandardCheckpointer() as ckpt:
      saved = ckpt.metadata(self.frozen_directory).item_metadata
      return restore_in_layout(lambda t: ckpt.restore(self.frozen_directory, t), saved, target)

  def close(self):
    self.manager.wait_until_finished()
    self.manager.close()
