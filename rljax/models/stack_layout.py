"""Scanned-layer state trees: conversion between the stacked layout of `LayerStack`s
(`layers/<g>/layer/...` [n, ...]) and one entry per layer (`layers/<i>/...`), for
parameters, optimizer moments and orbax restore targets (checkpoints written in the other
layout). `rljax.models.stack` re-exports the public names.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

LAYERS_AXIS = "layers"   # the logical name of the stacked axis
LAYERS_KEY = "layers"    # the attribute holding a model's list of blocks
STACK_KEY = "layer"      # a LayerStack's stacked module


def is_variable(x) -> bool:
  """Whether `x` is an `nnx.Variable` (a leaf of the trees converted here)."""
  return isinstance(x, nnx.Variable)


def with_layers_axis(variable, stacked_value):
  """A copy of `variable` holding `stacked_value`, "layers" prepended to its logical axes."""
  out = variable.replace(stacked_value)
  axes = variable.get_metadata().get("out_sharding")
  if axes:
    out.set_metadata(out_sharding=(LAYERS_AXIS, *axes))
  return out


def _is_stack(group) -> bool:
  return isinstance(group, Mapping) and list(group.keys()) == [STACK_KEY]


def _is_layer_list(node) -> bool:
  return isinstance(node, Mapping) and bool(node) and all(
      isinstance(k, int) for k in node.keys())


def _count(stack_group) -> int:
  return int(jax.tree.leaves(stack_group)[0].shape[0])


def _drop_axis(sharding):
  if isinstance(sharding, NamedSharding):
    return NamedSharding(sharding.mesh, PartitionSpec(*tuple(sharding.spec)[1:]),
                         memory_kind=sharding.memory_kind)
  return sharding


def _add_axis(sharding):
  if isinstance(sharding, NamedSharding):
    return NamedSharding(sharding.mesh, PartitionSpec(None, *sharding.spec),
                         memory_kind=sharding.memory_kind)
  return sharding


def _layer_variable(variable, value):
  """A copy of a stacked `variable` holding one layer's `value`, "layers" dropped from its
  logical axes."""
  out = variable.replace(value)
  axes = variable.get_metadata().get("out_sharding")
  if axes and axes[0] == LAYERS_AXIS:
    out.set_metadata(out_sharding=tuple(axes[1:]))
  return out


def _take(x, j):
  """Element j of a leaf's leading axis (an array, a ShapeDtypeStruct or a Variable)."""
  if is_variable(x):
    return _layer_variable(x, _take(x.get_raw_value(), j))
  if isinstance(x, jax.ShapeDtypeStruct):
    return jax.ShapeDtypeStruct(x.shape[1:], x.dtype,
                                sharding=_drop_axis(getattr(x, "sharding", None)))
  return x[j]


def _stack(xs, like=None):
  """The leaves `xs` stacked on a new leading axis, placed like `like` when given."""
  first = xs[0]
  if is_variable(first):
    value = _stack([x.get_raw_value() for x in xs], None if like is None else like.get_raw_value())
    return with_layers_axis(first, value) if like is None else like.replace(value)
  if isinstance(first, jax.ShapeDtypeStruct):
    return jax.ShapeDtypeStruct((len(xs), *first.shape), first.dtype,
                                sharding=_add_axis(getattr(first, "sharding", None)))
  out = np.stack(xs) if isinstance(first, np.ndarray) else jnp.stack(xs)
  sharding = getattr(like, "sharding", None)
  return jax.device_put(out, sharding) if isinstance(sharding, NamedSharding) else out


def _raw(node):
  """A mapping's own dict (an nnx.State wraps its nested dicts in States when indexed)."""
  return node.raw_mapping if isinstance(node, nnx.State) else node


def _map_layer_lists(tree, fn, like=None):
  """`tree` with every list of layers (the value of a "layers" key whose keys are ints)
  replaced by fn(layers, the same node of `like` or None); other nodes rebuilt as they are."""
  if is_variable(tree) or not isinstance(tree, Mapping | tuple | list):
    return tree
  if isinstance(tree, Mapping):
    out = {}
    for key, node in _raw(tree).items():
      other = None if like is None else _raw(like)[key]
      if key == LAYERS_KEY and _is_layer_list(node):
        out[key] = fn(node, other)
      else:
        out[key] = _map_layer_lists(node, fn, other)
    return type(tree)(out)
  items = [_map_layer_lists(node, fn, None if like is None else like[i])
           for i, node in enumerate(tree)]
  return type(tree)(*items) if hasattr(tree, "_fields") else type(tree)(items)


def _unstack_groups(groups, _like=None):
  groups, out = _raw(groups), {}
  for key in sorted(groups):
    group = groups[key]
    if _is_stack(group):
      for j in range(_count(group)):
        out[len(out)] = jax.tree.map(lambda x, j=j: _take(x, j), group[STACK_KEY],
                                     is_leaf=is_variable)
    else:
      out[len(out)] = group
  return type(groups)(out)


def per_layer_layout(tree):
  """`tree` (a state tree: parameters, optimizer state, a restore target) with every
  `LayerStack` group replaced by its layers, one entry each: `layers/<g>/layer/...` [n, ...]
  becomes `layers/<i>/...` [...], i counting layers over all groups."""
  return _map_layer_lists(tree, _unstack_groups)


def _layer_views(x, hosts: list | None = None) -> list | None:
  """The slices of array `x` along its leading axis as arrays that share its memory, or
  None where they cannot: `x` on CPU devices (each a whole copy of the leading axis), in a
  dtype NumPy can view (bfloat16 cannot). The views hold a reference to `x`'s buffers:
  while any is alive, a donating step copies `x` instead of writing in place.

  An abstract `x` (a `jax.ShapeDtypeStruct`, e.g. from `nnx.eval_shape`) gets the abstract
  slices an array of its dtype on the default device would get: a program compiled for
  them is the one the views of the concrete array run (`rljax.sampling.precompile`).
  `hosts` gets a weak reference to each NumPy array that holds that reference."""
  if isinstance(x, jax.ShapeDtypeStruct):
    probe = jnp.zeros((1,), x.dtype)   # on the default device, where `x` will be
    if x.ndim == 0 or x.sharding is not None or _layer_views(probe) is None:
      return None
    return [jax.ShapeDtypeStruct(x.shape[1:], x.dtype, sharding=probe.sharding)] * x.shape[0]
  if not isinstance(x, jax.Array) or x.ndim == 0 or not x.is_fully_addressable:
    return None
  shards = x.addressable_shards
  if any(s.device.platform != "cpu" or s.data.shape[0] != x.shape[0] for s in shards):
    return None
  try:
    host_arrays = [np.from_dlpack(s.data) for s in shards]
  except (BufferError, TypeError, RuntimeError):
    return None
  if hosts is not None:
    hosts.extend(weakref.ref(h) for h in host_arrays)
  sharding = _drop_axis(x.sharding)
  return [jax.make_array_from_single_device_arrays(
              x.shape[1:], sharding,
              [jax.device_put(h[j], s.device, may_alias=True)
               for h, s in zip(host_arrays, shards)])
          for j in range(x.shape[0])]


def per_layer_views(tree, hosts: list | None = None):
  """`per_layer_layout(tree)` whose layers share the stacked arrays' memory (no copy), or
  None when a stacked array cannot be viewed (`_layer_views`: not on the CPU, bfloat16).
  `hosts`: gets weak references to the host arrays holding the stacked buffers while the
  views live (`rljax.sampling.prepare.drop_sampling_copies` waits for them to go).

  For a program that reads each layer's parameters as its own argument: XLA CPU copies a
  slice of a stacked argument before a matmul reads it (every layer's, for a loop whose
  body reads them all: a decode step)."""
  failed = []

  def unstack(groups, _like=None):
    groups, out = _raw(groups), {}
    for key in sorted(groups):
      group = groups[key]
      if not _is_stack(group):
        out[len(out)] = group
        continue
      leaves, treedef = jax.tree.flatten(group[STACK_KEY], is_leaf=is_variable)
      views = []
      for leaf in leaves:
        value = _layer_views(leaf.get_raw_value() if is_variable(leaf) else leaf, hosts)
        failed.extend([leaf] if value is None else [])
        views.append(value)
      if failed:
        return groups
      for j in range(_count(group)):
        out[len(out)] = jax.tree.unflatten(treedef, [
            _layer_variable(leaf, v[j]) if is_variable(leaf) else v[j]
            for leaf, v in zip(leaves, views)])
    return type(groups)(out)

  out = _map_layer_lists(tree, unstack)
  return None if failed else out


def _stack_groups_like(groups, like_groups):
  groups, like_groups, out, i = _raw(groups), _raw(like_groups), {}, 0
  for key in sorted(like_groups):
    like = like_groups[key]
    if _is_stack(like):
      n = _count(like)
      parts = [groups[i + j] for j in range(n)]
      out[key] = {STACK_KEY: jax.tree.map(
          lambda lk, *xs: _stack(xs, lk), like[STACK_KEY], *parts, is_leaf=is_variable)}
      i += n
    else:
      out[key] = groups[i]
      i += 1
  if i != len(groups):
    raise ValueError(f"stack_like: {len(groups)} layers for a layout of {i}")
  return type(groups)(out)


def stack_like(tree, like):
  """The inverse of `per_layer_layout`: a per-layer `tree` in the stacked layout of `like`
  (same groups; arrays placed with `like`'s shardings when it has them)."""
  return _map_layer_lists(tree, _stack_groups_like, like)


def _kind(layer):
  """What makes two layers stackable: tree structure and leaf shapes."""
  shape = lambda x: tuple(getattr(x, "shape", ()))  # noqa: E731
  return (jax.tree.structure(layer, is_leaf=is_variable),
          tuple(map(shape, jax.tree.leaves(layer, is_leaf=is_variable))))


def _stack_all(groups, _like=None):
  """Per-layer groups -> one stack per run of identical consecutive layers (a decoder whose
  dense and mixture-of-experts layers alternate scans each run as its own stack)."""
  groups = _raw(groups)
  layers = [groups[k] for k in sorted(groups)]
  if any(_is_stack(g) for g in layers):
    return groups
  runs = []
  for layer in layers:
    if runs and _kind(runs[-1][0]) == _kind(layer):
      runs[-1].append(layer)
    else:
      runs.append([layer])
  return {g: {STACK_KEY: jax.tree.map(lambda *xs: _stack(xs), *run, is_leaf=is_variable)}
          for g, run in enumerate(runs)}


def _path_key(entry) -> str:
  for field in ("key", "name", "idx"):
    if hasattr(entry, field):
      return str(getattr(entry, field))
  return str(entry)


def tree_paths(tree) -> set[tuple[str, ...]]:
  """The leaf paths of a pytree, each key as a string (orbax metadata trees compare equal
  to the trees they were written from)."""
  return {tuple(map(_path_key, path)) for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]}


def checkpoint_layout(saved_tree, target) -> tuple[object, Callable]:
  """(what to restore, a function from it to `target`'s layout), for a checkpoint whose
  tree is `saved_tree` (e.g. orbax metadata) and a restore target `target`.

  A checkpoint in `target`'s layout is restored as it is; one written per layer (before
  layers were scanned, or with `ModelConfig.scan_layers=False`) into a scanned target is
  restored per layer and stacked (`stack_like`); a scanned one into a per-layer target is
  restored stacked and split. Any other mismatch is left for the restore to report.
  """
  saved = tree_paths(saved_tree)
  if tree_paths(target) <= saved:
    return target, lambda tree: tree
  unstacked = per_layer_layout(target)
  if tree_paths(unstacked) <= saved:
    return unstacked, lambda tree: stack_like(tree, target)
  stacked = _map_layer_lists(target, _stack_all)
  if tree_paths(stacked) <= saved:
    return stacked, per_layer_layout
  return target, lambda tree: tree


def restore_in_layout(restore: Callable, saved_tree, target):
  """`restore(t)` for the `t` of `checkpoint_layout(saved_tree, target)`, converted to
  `target`'s layout: a checkpoint written per layer restores into a scanned model (and
  back). `restore` takes the restore target (its shapes, dtypes and shardings)."""
  restore_target, convert = checkpoint_layout(saved_tree, target)
  return convert(restore(restore_target))
