"""Device meshes with the three rljax axes: data, fsdp, tensor."""

from __future__ import annotations

import math

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")  # the batch dimension is split over both


def select_devices(num_devices: int, devices=None) -> list:
  """The first `num_devices` devices (0: all), taken evenly from every process.

  With one process these are `jax.devices()[:num_devices]`. With several, every process
  must hold devices of the mesh (it runs the same SPMD program on its own), so each
  contributes its first `num_devices / process_count` local devices; a plain prefix of
  the global list would be process 0's devices only.

  Args:
    num_devices: devices wanted, 0 for all.
    devices: the global device list (default `jax.devices()`); each has `process_index`.
  Raises:
    ValueError: num_devices is negative, above the device count, not a multiple of the
      number of processes, or more than a process holds.
  """
  devices = list(jax.devices() if devices is None else devices)
  if num_devices == 0:
    return devices
  if not 0 < num_devices <= len(devices):
    raise ValueError(f"parallel.num_devices={num_devices} must be in [0, {len(devices)}] "
                     "(0: all devices)")
  processes = sorted({d.process_index for d in devices})
  if len(processes) == 1:
    return devices[:num_devices]
  per_process, rest = divmod(num_devices, len(processes))
  local = {p: [d for d in devices if d.process_index == p] for p in processes}
  if rest or any(len(ds) < per_process for ds in local.values()):
    raise ValueError(
        f"parallel.num_devices={num_devices} must be a multiple of the {len(processes)} "
        f"processes and at most {len(processes)} x {min(map(len, local.values()))} (each "
        "process contributes the same number of its own devices)")
  return [d for p in processes for d in local[p][:per_process]]


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
  axis_types = (AxisType.Auto,) * 3
  try:   # devices ordered along the TPU torus when they form a physical sub-mesh
    return jax.make_mesh(tuple(sizes), MESH_AXES, axis_types=axis_types, devices=devices)
  except (AssertionError, ValueError, NotImplementedError):
    # e.g. a sampler's share of a slice (`split_devices`), not a rectangle of chips: the
    # devices in their given order
    return Mesh(np.asarray(devices, dtype=object).reshape(sizes), MESH_AXES,
                axis_types=axis_types)


def batch_sharding(mesh: Mesh, ndim: int | None = None) -> NamedSharding:
  """Sharding for [B, ...] arrays: B split over (data, fsdp), other dimensions replicated."""
  rest = () if ndim is None else (None,) * (ndim - 1)
  return NamedSharding(mesh, PartitionSpec(BATCH_AXES, *rest))


def replicated_sharding(mesh: Mesh) -> NamedSharding:
  """Fully replicated sharding on `mesh` (scalars, RNG keys, small tables)."""
  return NamedSharding(mesh, PartitionSpec())


def split_devices(devices, sampler_count: int) -> tuple[list, list]:
  """(trainer devices, sampler devices): the last `sampler_count` devices, taken evenly from
  every process's own (each process then samples on its devices and trains on the others,
  as in the single-process case), serve the sampler; 0: both use all of them (colocated).

  Raises:
    ValueError: the split leaves a side without devices, or is not even over processes.
  """
  devices = list(devices)
  if sampler_count == 0:
    return devices, devices
  if not 0 < sampler_count < len(devices):
    raise ValueError(f"parallel.sampler_devices={sampler_count} must be 0 (colocated) or in "
                     f"[1, {len(devices) - 1}] (the trainer keeps at least one device)")
  processes = sorted({d.process_index for d in devices})
  per_process, rest = divmod(sampler_count, len(processes))
  local = {p: [d for d in devices if d.process_index == p] for p in processes}
  if rest or any(len(ds) <= per_process for ds in local.values()):
    raise ValueError(f"parallel.sampler_devices={sampler_count} must be a multiple of the "
                     f"{len(processes)} processes, leaving each process a trainer device")
  trainer = [d for p in processes for d in local[p][:len(local[p]) - per_process]]
  sampler = [d for p in processes for d in local[p][len(local[p]) - per_process:]]
  return trainer, sampler
