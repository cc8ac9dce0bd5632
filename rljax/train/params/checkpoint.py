"""Checkpoints with orbax-checkpoint: the whole TrainState plus host-side state as JSON.

Orbax writes each step into a temporary directory and renames it when complete, so a
half-written checkpoint is never picked up. On restore, an unreadable newest step is
reported and the previous one is used. A checkpoint written with one module per decoder
layer (before `ModelConfig.scan_layers`, or with it off) restores into a scanned model, its
layers stacked (`rljax.models.stack.checkpoint_layout`), and the other way round. Under `jax.distributed` every process calls
`save` / `restore_latest` (orbax writes and reads collectively; each process its shards).
"""

from __future__ import annotations

import logging
import pathlib

import jax
import orbax.checkpoint as ocp

from rljax import parallel
from rljax.models.stack import restore_in_layout

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
