"""Reference-model offload: frozen parameters live in host memory between their uses.

The reference policy is read once per rollout (`iteration.prepare`: the reference
log-probs of the whole batch), so keeping its parameters in device memory for the rest
of the iteration costs one model's worth of HBM for nothing. With
`algo.reference_offload=True` the TrainState holds them in host memory:

- where every device has a `"pinned_host"` memory space (`d.addressable_memories()`: TPU,
  GPU, and the CPU backend of JAX 0.10.2, which lists device, pinned_host and
  unpinned_host), as `jax.Array`s with the same sharding and memory kind `"pinned_host"`
  (each shard stays with its device's host, so this is multi-host safe, and orbax
  checkpoints and restores them with that memory kind). This is the parameter offloading
  of JAX's "Memory spaces and host offloading" guide (docs.jax.dev, 201/memory-spaces):
  `jax.device_put` with `sharding.with_memory_kind(...)` both ways;
- otherwise as NumPy copies (single process only).

`fetch` copies them back, with the actor's device shardings, just for the reference
forward pass; the device copy is dropped when the batch is prepared. Same shardings as
the actor means the reference forward reuses the actor forward's compiled program.

The update step never sees the reference parameters (`update.build_update_step` strips
them), so nothing in host memory enters a jitted program.
"""

from __future__ import annotations

import jax
import numpy as np

HOST_MEMORY_KIND = "pinned_host"


def host_memory_supported(devices=None) -> bool:
  """True when every device (default: all of them) addresses a `"pinned_host"` memory."""
  devices = jax.devices() if devices is None else devices
  return all(HOST_MEMORY_KIND in {m.kind for m in d.addressable_memories()} for d in devices)


def _host_copy(x, pinned: bool):
  if isinstance(x, np.ndarray):
    return x
  if pinned:
    return jax.device_put(x, x.sharding.with_memory_kind(HOST_MEMORY_KIND))
  if not x.is_fully_addressable:
    raise ValueError("algo.reference_offload: this backend has no 'pinned_host' memory and "
                     "NumPy host copies of parameters sharded across processes are unsupported")
  return np.array(x, copy=True)   # a real copy: device buffers may be donated later


def to_host(tree):
  """Host-memory copies of the arrays of `tree` (idempotent; `None` passes through)."""
  if tree is None:
    return None
  pinned = host_memory_supported()
  return jax.tree.map(lambda x: _host_copy(x, pinned), tree)


def is_on_host(x) -> bool:
  """True for a NumPy array or a `jax.Array` in a host memory space."""
  if isinstance(x, np.ndarray):
    return True
  kind = getattr(x.sharding, "memory_kind", None)
  return kind is not None and kind.endswith("_host")


def fetch(tree, like):
  """`tree` in device memory with the shardings of the matching leaves of `like`.

  Args:
    tree: e.g. the TrainState's reference parameters (host or device resident).
    like: a pytree of the same structure on the devices (e.g. the actor parameters).
  Returns:
    `tree` itself when it is already on the devices, else device copies.
  """
  if tree is None or not any(is_on_host(x) for x in jax.tree.leaves(tree)):
    return tree
  return jax.tree.map(lambda x, y: jax.device_put(x, y.sharding), tree, like)
