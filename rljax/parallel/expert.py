"""Expert parallelism with explicit collectives: a MoE layer's tokens dispatched to the devices
that hold their experts (`shard_map` over the mesh's expert axis).

The alternative needs no code: put the expert weights on the expert axis
(`rljax.parallel.shard_model`, logical axis "expert") and let `jit`'s sharding propagation
partition the grouped matmuls. These functions make the communication explicit, for when
the propagation's choice is poor. Both are exact: no token is dropped (no capacity factor).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec

from rljax.parallel.mesh import BATCH_AXES, EXPERT_AXIS


def _all_gather_dispatch(experts_fn, x_td, ids_tk, weights_tk, *expert_weights):
  """Every device gathers its expert group's tokens, computes the pairs routed to its local
  experts, and a reduce-scatter sums the partial outputs back onto the tokens' devices
  (Megatron-LM's "allgather" token dispatcher)."""
  e_local = expert_weights[0].shape[0]
  first = jax.lax.axis_index(EXPERT_AXIS) * e_local
  gather = functools.partial(jax.lax.all_gather, axis_name=EXPERT_AXIS, tiled=True)
  x_all, ids_all, w_all = gather(x_td), gather(ids_tk), gather(weights_tk)  # [T_group, ...]
  local = ids_all - first
  local = jnp.where((local >= 0) & (local < e_local), local, e_local)  # e_local: not here
  y = experts_fn(x_all, local, w_all, *expert_weights)  # [T_group, D], local experts only
  return jax.lax.psum_scatter(y, EXPERT_AXIS, scatter_dimension=0, tiled=True)


def _all_to_all_dispatch(experts_fn, x_td, ids_tk, weights_tk, *expert_weights):
  """Each (token, expert) pair travels to its expert's device and back by two all-to-alls
  (GShard: Lepikhin et al. 2020, arXiv:2006.16668, §3.2); the weighted sum over a token's
  k experts happens on the token's device.

  Note: the buffers hold the worst case, all T·k local pairs for every destination
  ([n, T·k, D] per device), so nothing is dropped; `jax.lax.ragged_all_to_all` would send
  only the real pairs but XLA:CPU does not implement it.
  """
  n = jax.lax.axis_size(EXPERT_AXIS)
  e_local = expert_weights[0].shape[0]
  t, k = ids_tk.shape
  pairs = t * k
  dest = (ids_tk // e_local).reshape(-1)  # [N], the device of every pair
  order = jnp.argsort(dest, stable=True)
  dest_sorted = dest[order]
  counts = jnp.bincount(dest, length=n)
  slot = jnp.arange(pairs) - (jnp.cumsum(counts) - counts)[dest_sorted]  # place in the buffer
  send_x = jnp.zeros((n, pairs, x_td.shape[-1]), x_td.dtype).at[dest_sorted, slot].set(
      x_td[order // k])
  send_e = jnp.full((n, pairs), e_local, jnp.int32).at[dest_sorted, slot].set(
      (ids_tk.reshape(-1) % e_local)[order])
  exchange = functools.partial(jax.lax.all_to_all, axis_name=EXPERT_AXIS, split_axis=0,
                               concat_axis=0, tiled=True)
  recv_x, recv_e = exchange(send_x), exchange(send_e)  # [n, N, ...], one row per source
  ones = jnp.ones((n * pairs, 1), jnp.float32)
  y = experts_fn(recv_x.reshape(n * pairs, -1), recv_e.reshape(-1, 1), ones, *expert_weights)
  back = exchange(y.reshape(n, pairs, -1))  # [n, N, D], my pairs' outputs by destination
  y_pairs = jnp.zeros((pairs, back.shape[-1]), back.dtype).at[order].set(
      back[dest_sorted, slot])  # [N, D] in pair order
  out = jnp.einsum("tkd,tk->td", y_pairs.reshape(t, k, -1).astype(jnp.float32),
                   weights_tk.astype(jnp.float32))
  return out.astype(x_td.dtype)


EXPERT_DISPATCH = {"all_gather": _all_gather_dispatch, "all_to_all": _all_to_all_dispatch}


def expert_parallel(experts_fn: Callable, x_td, ids_tk, weights_tk, *expert_weights,
                    mesh: Mesh, dispatch: str = "all_to_all"):
  """`experts_fn` applied with the experts split over the mesh's "expert" axis.

  Args:
    experts_fn: (x [N,D], ids [N,k], weights [N,k], *weights [E_local, ...]) -> [N,D], the
      weighted sum of each row's experts among the local ones; id E_local marks a pair to
      skip (`rljax.models.moe.grouped_swiglu`).
    x_td: tokens [T,D], T split over the mesh's batch axes and the expert axis.
    ids_tk: int [T,k] global expert ids; weights_tk: float32 [T,k].
    *expert_weights: arrays [E, ...] (E a multiple of the expert axis size), split over it.
    mesh: a mesh with an "expert" axis (`make_mesh(expert=n)`).
    dispatch: "all_to_all" or "all_gather" (`EXPERT_DISPATCH`).
  Returns:
    [T,D], as `experts_fn` on one device.
  Raises:
    ValueError: an unknown dispatch, or a mesh without the expert axis.
  """
  if dispatch not in EXPERT_DISPATCH:
    raise ValueError(f"expert dispatch {dispatch!r} unknown; valid: {sorted(EXPERT_DISPATCH)}")
  if EXPERT_AXIS not in mesh.axis_names:
    raise ValueError(f"expert_parallel needs a mesh with an {EXPERT_AXIS!r} axis, got "
                     f"{mesh.axis_names} (make_mesh(expert=n))")
  tokens = PartitionSpec(tuple(a for a in (*BATCH_AXES, EXPERT_AXIS) if a in mesh.axis_names))
  experts = PartitionSpec(EXPERT_AXIS)
  fn = functools.partial(EXPERT_DISPATCH[dispatch], experts_fn)
  return jax.shard_map(fn, mesh=mesh, in_specs=(tokens,) * 3 + (experts,) * len(expert_weights),
                       out_specs=tokens)(x_td, ids_tk, weights_tk, *expert_weights)
