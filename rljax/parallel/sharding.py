"""Logical axis names -> mesh axes: the ONE rules table, parameter placement, checks.

Model code annotates every parameter with logical axis names (Flax NNX `out_sharding`
metadata, e.g. `("embed", "mlp")`); this module alone maps them to the mesh axes
`data`, `fsdp`, `tensor` and `expert` (the MaxText / Flax "logical axis rules" pattern). A
mesh without one of these axes acts as if it had it with size 1: what the rules put there is
replicated.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

# logical axis -> mesh axis (or tuple of mesh axes, or None = replicated)
LOGICAL_AXIS_RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
    ("batch", ("data", "fsdp")),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("kv", None),
    ("norm", None),
    ("layers", None),
    ("lora", None),          # the rank axis of LoRA adapters: small, replicated
    ("expert", "expert"),    # the experts of a MoE layer: expert parallelism
    ("router", None),        # a MoE router's scores: every device needs all of them
)


def logical_to_mesh_spec(logical_axes: Sequence[str | None],
                         rules=LOGICAL_AXIS_RULES) -> PartitionSpec:
  """Maps a tuple of logical axis names to a `PartitionSpec` by `rules`.

  A mesh axis is used at most once per spec (a later dimension that maps to an axis
  already taken is replicated).

  Raises:
    ValueError: a logical name without a rule (lists the known names).
  """
  table = dict(rules)
  used: set[str] = set()
  out = []
  for name in logical_axes:
    if name is None:
      out.append(None)
      continue
    if name not in table:
      raise ValueError(f"Logical axis {name!r} has no rule; known: {sorted(table)}")
    target = table[name]
    axes = () if target is None else (target,) if isinstance(target, str) else tuple(target)
    axes = tuple(a for a in axes if a not in used)
    used.update(axes)
    out.append(None if not axes else axes[0] if len(axes) == 1 else axes)
  return PartitionSpec(*out)


def _fit_to_shape(spec: PartitionSpec, shape, mesh: Mesh) -> PartitionSpec:
  """Replicates any dimension the assigned mesh axes do not divide (e.g. 1 KV head), and drops
  mesh axes `mesh` does not have (e.g. "expert" on a data/fsdp/tensor mesh)."""
  out = []
  for dim, entry in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
    axes = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
    axes = tuple(a for a in axes if a in mesh.axis_names)
    entry = None if not axes else axes[0] if len(axes) == 1 else axes
    size = int(np.prod([mesh.shape[a] for a in axes])) if axes else 1
    out.append(entry if size > 1 and dim % size == 0 else None)
  return PartitionSpec(*out)


def variable_sharding(var: nnx.Variable, mesh: Mesh, rules=LOGICAL_AXIS_RULES) -> NamedSharding:
  """NamedSharding of one NNX Variable from its `out_sharding` logical names."""
  logical = var.get_metadata().get("out_sharding") or ()
  spec = logical_to_mesh_spec(logical, rules) if logical else PartitionSpec()
  return NamedSharding(mesh, _fit_to_shape(spec, var.shape, mesh))


def state_shardings(state, mesh: Mesh, rules=LOGICAL_AXIS_RULES):
  """A tree like `state` (an `nnx.State`) whose Variables hold `NamedSharding`s."""
  return jax.tree.map(lambda v: v.replace(variable_sharding(v, mesh, rules)), state,
                      is_leaf=lambda x: isinstance(x, nnx.Variable))


def shard_model(model: nnx.Module, mesh: Mesh, rules=LOGICAL_AXIS_RULES) -> nnx.Module:
  """Places every parameter of `model` on `mesh` according to its logical axes (in place).

  Returns:
    the same `model`, for chaining.
  """
  state = nnx.state(model)
  nnx.update(model, jax.device_put(state, state_shardings(state, mesh, rules)))
  return model


def sharding_report(model: nnx.Module) -> dict[str, float]:
  """Parameter bytes: total, fully replicated, and the largest per-device share."""
  total = replicated = 0
  per_device: dict = {}
  for x in jax.tree.leaves(nnx.state(model, nnx.Param)):
    total += x.nbytes
    if x.sharding.is_fully_replicated:
      replicated += x.nbytes
    for shard in x.addressable_shards:
      per_device[shard.device] = per_device.get(shard.device, 0) + shard.data.nbytes
  return {"total_bytes": total, "replicated_bytes": replicated,
          "max_device_bytes": max(per_device.values(), default=0),
          "replicated_fraction": replicated / max(total, 1)}


def replicated_fraction(model: nnx.Module) -> float:
  """Fraction of parameter bytes held fully replicated on every device (start-up check).

  1.0 for an unsharded model; close to 0 when FSDP / tensor sharding applies to all
  large matrices (norm scales and biases are replicated by design).
  """
  return sharding_report(model)["replicated_fraction"]


def assert_sharded(model: nnx.Module, *, max_replicated_fraction: float = 0.1) -> float:
  """Start-up check: fails if more than `max_replicated_fraction` of parameter bytes are
  fully replicated (e.g. a model never passed through `shard_model` on a multi-device mesh).

  Returns:
    the replicated fraction.
  Raises:
    ValueError: naming the largest replicated parameters.
  """
  fraction = replicated_fraction(model)
  if fraction > max_replicated_fraction:
    flat = nnx.to_flat_state(nnx.state(model, nnx.Param))
    repl = sorted(((v.nbytes, "/".join(map(str, p))) for p, v in flat
                   if v[...].sharding.is_fully_replicated), reverse=True)[:5]
    raise ValueError(f"{fraction:.1%} of parameter bytes are replicated (limit "
                     f"{max_replicated_fraction:.1%}); largest: {[n for _, n in repl]}")
  return fraction
