"""Device meshes with the rljax axes: data, fsdp, tensor, and expert for mixture-of-experts."""

from __future__ import annotations

import functools
import math

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")  # the batch dimension is split over both
EXPERT_AXIS = "expert"  # MoE expert parallelism; only in meshes made with expert > 1


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


def make_mesh(data: int = -1, fsdp: int = 1, tensor: int = 1, *, expert: int = 1,
              devices=None) -> Mesh:
  """A (data, fsdp, tensor) mesh, with an expert axis before tensor when expert > 1; one of
  data, fsdp, tensor may be -1 ("all remaining devices").

  Args:
    data: data-parallel replicas (parameters replicated, batch split).
    fsdp: fully-sharded data parallel (parameters and batch split).
    tensor: tensor parallel (heads / MLP / vocab split).
    expert: expert parallel (a MoE layer's experts split); 1: no expert axis (parameters
      with the logical axis "expert" are then replicated over it, `rljax.parallel.sharding`).
    devices: devices to use (default: all of `jax.devices()`).
  Returns:
    `jax.sharding.Mesh` with axis names `MESH_AXES`, or (data, fsdp, expert, tensor) (Auto
    axis types).
  Raises:
    ValueError: the sizes do not multiply to the number of devices, or expert < 1.
  """
  devices = list(jax.devices() if devices is None else devices)
  try:
    sizes = mesh_axis_sizes(data, fsdp, tensor, expert=expert, num_devices=len(devices))
  except ValueError as e:
    raise ValueError(f"make_mesh: {e}") from None
  if expert == 1:
    return _physical_mesh(tuple(sizes), MESH_AXES, devices)
  return _physical_mesh((sizes[0], sizes[1], expert, sizes[2]),
                        ("data", "fsdp", EXPERT_AXIS, "tensor"), devices)


def _physical_mesh(shape, names, devices) -> Mesh:
  """The devices ordered along the TPU torus when they form a physical sub-mesh, else in
  their given order (e.g. a sampler's share of a slice, `split_devices`, not a rectangle of
  chips)."""
  axis_types = (AxisType.Auto,) * len(shape)
  try:
    return jax.make_mesh(shape, names, axis_types=axis_types, devices=devices)
  except (AssertionError, ValueError, NotImplementedError):
    return Mesh(np.asarray(devices, dtype=object).reshape(shape), names, axis_types=axis_types)


def mesh_axis_sizes(data: int, fsdp: int, tensor: int, *, expert: int = 1,
                    num_devices: int) -> list[int]:
  """[data, fsdp, tensor] of a mesh over `num_devices` devices, the one rule `make_mesh` and
  the config's validation apply: the expert axis takes its share first, then one of the
  three sizes may be -1 ("all remaining devices") and they multiply to the rest.

  Raises:
    ValueError: a message that starts with the size at fault (`expert=3 does not divide
      ...`), so that a caller can prefix where the sizes come from (`parallel.`).
  """
  if expert < 1:
    raise ValueError(f"expert={expert} must be >= 1 (1: no expert axis)")
  if num_devices % expert:
    raise ValueError(f"expert={expert} does not divide the {num_devices} devices")
  num_devices //= expert
  sizes = dict(zip(MESH_AXES, (data, fsdp, tensor)))
  for name, size in sizes.items():
    if size == 0 or size < -1:
      raise ValueError(f"{name}={size} must be >= 1, or -1 (all remaining devices)")
  if list(sizes.values()).count(-1) > 1:
    raise ValueError(f"{'=-1 and '.join(k for k, v in sizes.items() if v == -1)}=-1: at most "
                     "one size may be -1 (all remaining devices)")
  fixed = math.prod(v for v in sizes.values() if v > 0)
  if -1 in sizes.values():
    if num_devices % fixed:
      raise ValueError(f"data*fsdp*tensor={fixed} (without the -1) does not divide the "
                       f"{num_devices} devices ({sizes})")
    sizes = {k: v if v > 0 else num_devices // fixed for k, v in sizes.items()}
  elif fixed != num_devices:
    raise ValueError(f"data*fsdp*tensor={fixed} must equal the {num_devices} devices ({sizes})")
  return list(sizes.values())


def batch_sharding(mesh: Mesh, ndim: int | None = None) -> NamedSharding:
  """Sharding for [B, ...] arrays: B split over (data, fsdp), other dimensions replicated."""
  rest = () if ndim is None else (None,) * (ndim - 1)
  return NamedSharding(mesh, PartitionSpec(BATCH_AXES, *rest))


def batch_shards(mesh) -> int:
  """How many shards the batch dimension is split into: the product of the sizes of the
  mesh's batch axes (`BATCH_AXES` present in it); 1 without a mesh. Row counts that go
  on the mesh round up to a multiple of it."""
  if mesh is None:
    return 1
  return math.prod(mesh.shape[a] for a in BATCH_AXES if a in mesh.axis_names)


def replicated_sharding(mesh: Mesh) -> NamedSharding:
  """Fully replicated sharding on `mesh` (scalars, RNG keys, small tables)."""
  return NamedSharding(mesh, PartitionSpec())


def traced_on(mesh: Mesh | None, fn):
  """`fn` whose trace runs under `mesh` (its abstract mesh), for the body of a `jax.jit`.

  What `jax.set_mesh(mesh)` gives a trace (it cannot be entered inside `jax.jit`): code that
  reads `jax.sharding.get_abstract_mesh()` sees the devices the program is compiled for.
  `model.attention="auto"` needs it to pick Pallas splash attention on TPU and run it per
  shard (`rljax.models.attention_kernels`); GSPMD's partitioning of everything else is the
  same (the mesh's axes are Auto). With `mesh` None, `fn` itself.

  Args:
    mesh: the mesh the program's arguments live on (a sampler's own devices for the
      sampler's programs); compile-only TPU devices for `rljax plan`.
  """
  if mesh is None:
    return fn

  @functools.wraps(fn)
  def under_mesh(*args, **kwargs):
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
      return fn(*args, **kwargs)
  return under_mesh


# A program whose arguments are smaller than this keeps XLA CPU's default order.
LOW_MEMORY_MIN_BYTES = 2 ** 30


def low_memory_compiler_options(mesh: Mesh | None, arguments, *, remat: bool = False) -> dict:
  """`jax.jit(compiler_options=...)` that order a big CPU program for its peak memory.

  XLA CPU orders a program's instructions for concurrency by default, which may allocate
  a buffer long before it is read. In a training step with scanned layers it allocated the
  backward's zero-filled gradient accumulators (and the embedding's) before the forward
  loop, beside every saved activation. The memory order changes which independent
  instruction runs first, never a value. Measured on the update step (benchmarks/README.md,
  "The update step in XLA CPU's memory order"): Qwen2.5-0.5B at 8 x 144 tokens (5.6 GB of
  state), temporaries 5,597 -> 4,871 MB at 1.007x the time; the toy model (35 MB of
  state), 601 -> 556 MB at 1.044x the time.
  Hence for programs whose arguments reach `LOW_MEMORY_MIN_BYTES` together, and for any
  program that recomputes activations (`remat`): in the default order XLA CPU ran the
  recomputations early and kept their results, so remat saved little (0.5B update step
  with `model.remat`: 3,769 MB of temporaries in the default order, 2,502 in memory order).

  Args:
    mesh: the program's mesh; its devices' platform decides (None: the default backend).
    arguments: a pytree of the program's arguments (arrays or ShapeDtypeStructs; a
      train state, say).
    remat: the program recomputes activations to save memory (`ModelConfig.remat`).
  Returns:
    {"xla_cpu_scheduler_type": "CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED"} for such a CPU
    program, else {} (GPU and TPU compilers order for memory by their own rules).
  """
  platform = jax.default_backend() if mesh is None else mesh.devices.flat[0].platform
  nbytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(arguments)
               if hasattr(x, "dtype"))
  if platform != "cpu" or (nbytes < LOW_MEMORY_MIN_BYTES and not remat):
    return {}
  return {"xla_cpu_scheduler_type": "CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED"}


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
