"""Per-process rows of batch-sharded global arrays (multi-host data loading).

Under `jax.distributed` a [R, ...] array split over the mesh's batch axes has only some
rows on each process's devices. These helpers name those rows, build the global array
from each process's own rows (`jax.make_array_from_callback`), read them back, and copy
small arrays whole onto every host (`multihost_utils.process_allgather`). In a single
process every row is local and they reduce to plain host <-> device copies.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.experimental import multihost_utils


def local_rows(sharding, num_rows: int) -> np.ndarray:
  """Sorted global indices of the rows of a [num_rows, ...] array with `sharding` that sit
  on this process's devices (all rows in a single process), int64 [L]."""
  index = sharding.addressable_devices_indices_map((num_rows,))
  return np.asarray(sorted({i for idx in index.values() for i in range(num_rows)[idx[0]]}),
                    np.int64)


def from_local_rows(values, rows, sharding, num_rows: int) -> jax.Array:
  """The global [num_rows, ...] array whose row `rows[k]` is `values[k]`.

  Args:
    values: host array [L, ...], this process's rows.
    rows: int [L], their global indices (`local_rows(sharding, num_rows)`).
    sharding: the global array's sharding (rows split over the batch axes).
    num_rows: R, the global number of rows.
  Returns:
    `jax.Array` [R, ...] (each process contributes only its own rows; no communication).
  """
  values = np.asarray(values)
  position = {int(r): k for k, r in enumerate(rows)}
  shape = (num_rows,) + values.shape[1:]
  return jax.make_array_from_callback(
      shape, sharding, lambda idx: values[[position[i] for i in range(num_rows)[idx[0]]]])


def to_local_rows(x: jax.Array, rows) -> np.ndarray:
  """Host copy of rows `rows` of the global array `x`, read from this process's shards."""
  found = {}
  for shard in x.addressable_shards:
    data = np.asarray(shard.data)
    for k, i in enumerate(range(x.shape[0])[shard.index[0]]):
      found.setdefault(i, data[k])
  return np.stack([found[int(i)] for i in rows]) if len(rows) else np.zeros((0,) + x.shape[1:],
                                                                             x.dtype)


def gather(tree):
  """Full host (NumPy) copies of the arrays in `tree` on every process.

  Arrays spanning processes are all-gathered: a collective, so every process must call
  this with the same tree. Everything else (host data, single-process arrays) is copied.
  """
  def get(x):
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
      return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)
  return jax.tree.map(get, tree)


def any_process(flag: bool) -> bool:
  """True if `flag` is set on any process (e.g. a signal that reached only some of them).
  A collective when there are several processes."""
  if jax.process_count() == 1:
    return bool(flag)
  return bool(np.any(multihost_utils.process_allgather(np.asarray([flag]))))


def is_primary() -> bool:
  """Process 0: the one that writes files (metrics, plots, results) and prints progress."""
  return jax.process_index() == 0


def move(tree, shardings):
  """`jax.device_put(tree, shardings)`, also between disjoint device sets that span
  processes (a sampler's and a trainer's devices): multi-controller JAX reshards across
  hosts only within one device set, so such arrays go through host memory (a collective:
  every process calls this with the same tree)."""
  def needs_host(x, sharding):
    return (isinstance(x, jax.Array) and not x.is_fully_addressable
            and x.sharding.device_set != sharding.device_set)
  shardings = (jax.tree.map(lambda _: shardings, tree)
               if isinstance(shardings, jax.sharding.Sharding) else shardings)
  staged = jax.tree.map(lambda x, s: gather(x) if needs_host(x, s) else x, tree, shardings)
  return jax.device_put(staged, shardings)
