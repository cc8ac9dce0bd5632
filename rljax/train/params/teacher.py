"""The frozen teacher of on-policy distillation (`algo.distill_teacher`).

A model beside the run's parameters, never inside the `TrainState`: it gets no gradient,
no optimizer state and no checkpoint (the directory it was loaded from is its checkpoint),
and its parameters sit on the run's mesh, sharded by their logical axes like the policy's
and the reference's (`rljax.parallel.shard_model`). `rljax.train.run.task_and_models` builds it
from the config; here are the parts that do not read a config: the `Teacher`, restoring an
rljax run's policy parameters, and the tokenizer comparison.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

import jax
import orbax.checkpoint as ocp
from flax import nnx

from rljax.models.stack import restore_in_layout


@dataclasses.dataclass
class Teacher:
  """A frozen model: its graph definition and its parameters on the run's mesh.

  Attributes:
    graphdef: `nnx.split` graph definition (its own: width and depth may differ from the
      student's, the vocabulary may not).
    params: nnx.State of every parameter, placed on the mesh.
    source: the directory it was loaded from.
  """

  graphdef: object
  params: object
  source: str

  def model(self):
    """The teacher as a module (for sampling from it)."""
    return nnx.merge(self.graphdef, self.params)


def is_run_dir(path) -> bool:
  """True for an rljax run directory: its `config.json` holds rljax's groups (`run`,
  `algo`, ...), where a Hugging Face checkpoint's holds the architecture's fields."""
  config = pathlib.Path(path) / "config.json"
  try:
    saved = json.loads(config.read_text())
  except (OSError, ValueError):
    return False
  return isinstance(saved, dict) and {"run", "model", "algo"} <= set(saved)


def _restore(directory, abstract, key=None):
  """`abstract`'s structure restored from an orbax pytree directory (only the subtree `key`
  of what was saved, when given), with `abstract`'s dtypes (cast) and shardings, and its
  layer layout (a run saved with one module per layer restores into a scanned model)."""
  target = jax.tree.map(ocp.utils.to_shape_dtype_struct, abstract)
  if key is not None:
    target = {key: target}

  def restore(item):
    args = jax.tree.map(lambda s: ocp.ArrayRestoreArgs(sharding=s.sharding, dtype=s.dtype), item)
    return ckpt.restore(directory, args=ocp.args.PyTreeRestore(
        item=item, restore_args=args, partial_restore=key is not None))
  with ocp.PyTreeCheckpointer() as ckpt:
    out = restore_in_layout(restore, ckpt.metadata(directory).item_metadata, target)
  return out if key is None else out[key]


def latest_step(run_dir) -> int | None:
  """The newest finished step under `<run_dir>/checkpoints` (orbax names a step's directory
  by its number once it is complete), or None."""
  directory = pathlib.Path(run_dir) / "checkpoints"
  steps = [int(p.name) for p in (directory.iterdir() if directory.is_dir() else ())
           if p.name.isdigit() and (p / "state").is_dir()]
  return max(steps) if steps else None


def restore_run_params(run_dir, params, *, lora: bool):
  """The policy of the newest checkpoint of the rljax run `run_dir`, restored alone (not its
  optimizer, critic or reference) into the structure, dtypes and shardings of `params`.

  Args:
    params: nnx.State of the run's model as built from its config (with its LoRA adapters
      when the run trained some: then its base comes from `<run_dir>/lora_base`).
  Returns:
    the restored nnx.State.
  Raises:
    FileNotFoundError: the run has no finished checkpoint.
  """
  run_dir = pathlib.Path(run_dir).absolute()
  step = latest_step(run_dir)
  if step is None:
    raise FileNotFoundError(f"algo.distill_teacher: {run_dir} has no finished checkpoint in "
                            "checkpoints/ (train it first, or set algo.distill_teacher_recipe)")
  state_dir = run_dir / "checkpoints" / str(step) / "state"
  if not lora:
    return _restore(state_dir, params, "actor")
  adapters, base = nnx.split_state(params, nnx.LoRAParam, ...)
  return nnx.merge_state(_restore(run_dir / "lora_base", base),
                         _restore(state_dir, adapters, "actor"))


def vocabulary(tokenizer):
  """What a tokenizer's ids mean: a character tokenizer's alphabet and tags, or a Hugging
  Face tokenizer's token -> id map (two tokenizers with equal vocabularies give every id
  the same token)."""
  hf = getattr(tokenizer, "hf", None)
  if hf is not None:
    return ("hf", tuple(sorted(hf.get_vocab().items())))
  return ("char", tokenizer.alphabet, tuple(tokenizer.tags))
