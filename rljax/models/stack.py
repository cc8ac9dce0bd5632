"""Scanned layers: identical blocks as one module whose parameters carry a leading "layers"
axis, run as one `jax.lax.scan`, and the conversion between that layout and one module per
layer (for checkpoints written in the other layout).

A Python loop over L blocks traces and compiles L copies of the block: compile time grows
with depth. A scan over the stacked parameters compiles the block once (MaxText's
`scan_layers`; the "Scan over layers" pattern of Flax NNX). `LayerStack` is generic over
the block: a decoder holds a list of blocks, each a single layer or a `LayerStack` of
identical layers, so a model whose layers differ (dense and mixture-of-experts layers, say)
scans each run of identical layers as its own stack.

Measured (benchmarks/compile_depth.py: the update step's model part, remat, bf16 compute,
fp32 parameters, 2,048 tokens per device): compile time stays flat in depth, and on XLA
CPU the scanned program's temporaries stay those of about one layer, where the unrolled
loop's grow with depth (it keeps every layer's activations despite remat). On TPU
(AOT, v5p) XLA converts a stack's fp32 weights to bf16 once, before the forward loop, and
keeps that copy for the backward loop: temporaries grow by about half the chip's fp32
parameter bytes (none with bf16 parameters).

Parameter paths: a per-layer decoder holds `layers/<i>/attn/q` [D,H,Dh]; a scanned one
`layers/<g>/layer/attn/q` [n,D,H,Dh] for its stack g of n layers, with the logical axis
"layers" first (never sharded: `rljax.parallel.LOGICAL_AXIS_RULES`). `per_layer_layout`,
`stack_like` and `checkpoint_layout` convert state trees (parameters, optimizer moments,
orbax restore targets) between the two.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

LAYERS_AXIS = "layers"   # the logical name of the stacked axis
LAYERS_KEY = "layers"    # the attribute holding a model's list of blocks
STACK_KEY = "layer"      # a LayerStack's stacked module


def _is_variable(x) -> bool:
  return isinstance(x, nnx.Variable)


def _with_value(variable, stacked_value):
  """A copy of `variable` holding `stacked_value`, "layers" prepended to its logical axes."""
  out = variable.replace(stacked_value)
  axes = variable.get_metadata().get("out_sharding")
  if axes:
    out.set_metadata(out_sharding=(LAYERS_AXIS, *axes))
  return out


def _stack_variables(*variables):
  return _with_value(variables[0], jnp.stack([v.get_raw_value() for v in variables]))


def stack_modules(modules: Sequence[nnx.Module]) -> nnx.Module:
  """One module of `modules[0]`'s structure whose Variables hold the modules' values stacked
  on a new leading axis, logical name "layers" prepended to their `out_sharding`.

  Raises:
    ValueError: the modules differ in structure.
  """
  graphdef = nnx.split(modules[0])[0]
  states = [nnx.split(m)[1] for m in modules]
  kinds = {(jax.tree.structure(s), tuple(jnp.shape(x) for x in jax.tree.leaves(s)))
           for s in states}
  if len(kinds) != 1:
    raise ValueError("stack_modules: the modules differ in structure")
  return nnx.merge(graphdef, jax.tree.map(_stack_variables, *states, is_leaf=_is_variable))


class LayerStack(nnx.Module):
  """`count` identical layers as one module (`layer`, parameters stacked on a leading
  "layers" axis) that runs them in order as one `jax.lax.scan`.

  Attributes:
    count: the number of layers n.
    layer: the stacked layer; its Variables are [n, ...].
  """

  def __init__(self, layers: Sequence[nnx.Module]):
    self.count = len(layers)
    self.layer = stack_modules(layers)

  def layers(self) -> list[nnx.Module]:
    """Every layer as its own module: slices of the stacked parameters (copies, for
    reading; writes to them do not reach the stack)."""
    graphdef, state = nnx.split(self.layer)
    return [nnx.merge(graphdef, jax.tree.map(lambda x, i=i: x[i], state))
            for i in range(self.count)]

  def __call__(self, x, *args, remat: bool = False):
    """x -> layer_{n-1}(... layer_0(x, *args) ..., *args), one scan step per layer.

    Args:
      x: the carry (hidden states), the first argument of the layer's `__call__`.
      *args: the layer's other arguments, the same for every layer.
      remat: recompute each layer's activations in the backward pass (`jax.checkpoint`
        around the scanned body, default policy: only its inputs are saved).
    """
    graphdef, state = nnx.split(self.layer)

    def body(x, layer_state):
      return nnx.merge(graphdef, layer_state)(x, *args), None
    if remat:
      body = jax.checkpoint(body, prevent_cse=False)   # scan already keeps the copies apart
    return jax.lax.scan(body, x, state)[0]


def call_layer(layer, x, *args, remat: bool = False):
  """`layer(x, *args)`, rematerialised in the backward pass when `remat`; `layer` is a
  single layer or a `LayerStack`.

  The single layer's remat is `jax.checkpoint` over its split state: unlike `nnx.remat`
  it works under plain `jax.grad` of a merged module (the trainer's update step), where
  nnx.remat fails with a TraceContextError.
  """
  if isinstance(layer, LayerStack):
    return layer(x, *args, remat=remat)
  if not remat:
    return layer(x, *args)
  graphdef, state = nnx.split(layer)
  return jax.checkpoint(lambda state, x, args: nnx.merge(graphdef, state)(x, *args))(
      state, x, args)


# ------------------------------------------------ per-layer <-> stacked state trees
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


def _take(x, j):
  """Element j of a leaf's leading axis (an array, a ShapeDtypeStruct or a Variable)."""
  if _is_variable(x):
    out = x.replace(_take(x.get_raw_value(), j))
    axes = x.get_metadata().get("out_sharding")
    if axes and axes[0] == LAYERS_AXIS:
      out.set_metadata(out_sharding=tuple(axes[1:]))
    return out
  if isinstance(x, jax.ShapeDtypeStruct):
    return jax.ShapeDtypeStruct(x.shape[1:], x.dtype,
                                sharding=_drop_axis(getattr(x, "sharding", None)))
  return x[j]


def _stack(xs, like=None):
  """The leaves `xs` stacked on a new leading axis, placed like `like` when given."""
  first = xs[0]
  if _is_variable(first):
    value = _stack([x.get_raw_value() for x in xs], None if like is None else like.get_raw_value())
    return _with_value(first, value) if like is None else like.replace(value)
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
  if _is_variable(tree) or not isinstance(tree, Mapping | tuple | list):
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
                                     is_leaf=_is_variable)
    else:
      out[len(out)] = group
  return type(groups)(out)


def per_layer_layout(tree):
  """`tree` (a state tree: parameters, optimizer state, a restore target) with every
  `LayerStack` group replaced by its layers, one entry each: `layers/<g>/layer/...` [n, ...]
  becomes `layers/<i>/...` [...], i counting layers over all groups."""
  return _map_layer_lists(tree, _unstack_groups)


def _stack_groups_like(groups, like_groups):
  groups, like_groups, out, i = _raw(groups), _raw(like_groups), {}, 0
  for key in sorted(like_groups):
    like = like_groups[key]
    if _is_stack(like):
      n = _count(like)
      parts = [groups[i + j] for j in range(n)]
      out[key] = {STACK_KEY: jax.tree.map(
          lambda lk, *xs: _stack(xs, lk), like[STACK_KEY], *parts, is_leaf=_is_variable)}
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


def _stack_all(groups, _like=None):
  groups = _raw(groups)
  layers = [groups[k] for k in sorted(groups)]
  if any(_is_stack(g) for g in layers):
    return groups
  stacked = jax.tree.map(lambda *xs: _stack(xs), *layers, is_leaf=_is_variable)
  return {0: {STACK_KEY: stacked}}


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
