"""Device meshes with the three rljax axes: data, fsdp, tensor."""

from __future__ import annotations

import math

import jax
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")  # the batch dimension is split over both


def make_mesh(data: int = -1, fsdp: int = 1, tensor: int = 1, *, devices=None) -> Mesh:
  """A (data, fsdp, tensor) mesh; one size may be -1 ("all remaining devices").

  Args:
    data: data-parallel replicas (parameters replicated, batch split).
    fsdp: fully-sharded data parallel (parameters and batch split).
    tensor: tensor parallel (heads / MLP / vocab split).
    devices: devices to use (default: all of `jax.devices()`).
  Returns:
    `jax.sharding.Mesh` with axis names `MESH_AXES` (Auto axis types).
  Raises:
    ValueError: the sizes do not multiply to the number of devices.
  """
  devices = list(jax.devices() if devices is None else devices)
  sizes = [data, fsdp, tensor]
  if sizes.count(-1) > 1:
    raise ValueError(f"make_mesh: at most one size may be -1, got {dict(zip(MESH_AXES, sizes))}")
  known = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if len(devices) % known:
      raise ValueError(f"make_mesh: {len(devices)} devices not divisible by {known}")
    sizes[sizes.index(-1)] = len(devices) // known
  if math.prod(sizes) != len(devices):
    raise ValueError(f"make_mesh: data*fsdp*tensor = {math.prod(sizes)} but there are "
                     f"{len(devices)} devices ({dict(zip(MESH_AXES, sizes))})")
  return jax.make_mesh(tuple(sizes), MESH_AXES, axis_types=(AxisType.Auto,) * 3,
                       devices=devices)


def batch_sharding(mesh: Mesh, ndim: int | None = None) -> NamedSharding:
  """Sharding for [B, ...] arrays: B split over (data, fsdp), other dimensions replicated."""
  rest = () if ndim is None else (None,) * (ndim - 1)
  return NamedSharding(mesh, PartitionSpec(BATCH_AXES, *rest))


def replicated_sharding(mesh: Mesh) -> NamedSharding:
  """Fully replicated sharding on `mesh` (scalars, RNG keys, small tables)."""
  return NamedSharding(mesh, PartitionSpec())
