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
orbax restore targets) between the two (`rljax.models.stack_layout`, re-exported here).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from rljax.models.stack_layout import (  # noqa: F401  (re-exported: the layout's public names)
  LAYERS_AXIS,
  LAYERS_KEY,
  STACK_KEY,
  checkpoint_layout,
  is_variable,
  per_layer_layout,
  restore_in_layout,
  stack_like,
  tree_paths,
  with_layers_axis,
)


def _stack_variables(*variables):
  return with_layers_axis(variables[0], jnp.stack([v.get_raw_value() for v in variables]))


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
  return nnx.merge(graphdef, jax.tree.map(_stack_variables, *states, is_leaf=is_variable))


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

  def __call__(self, x, *args, remat: bool = False, xs=None):
    """x -> layer_{n-1}(... layer_0(x, *args) ..., *args), one scan step per layer.

    Args:
      x: the carry (hidden states), the first argument of the layer's `__call__`.
      *args: the layer's other arguments, the same for every layer.
      remat: recompute each layer's activations in the backward pass (`jax.checkpoint`
        around the scanned body, default policy: only its inputs are saved).
      xs: optional per-layer inputs, a pytree of arrays with leading axis n: layer i gets
        their slice i as its last argument.
    Returns:
      the last layer's x; or (x, ys) when the layer returns a pair (x, y): ys is the
      layers' y stacked on a leading axis n (e.g. a mixture-of-experts layer's routing).
    """
    graphdef, state = nnx.split(self.layer)

    def body(x, per_layer):
      layer_state, extra = per_layer
      out = nnx.merge(graphdef, layer_state)(x, *args, *(() if extra is None else (extra,)))
      return out if isinstance(out, tuple) else (out, None)
    if remat:
      body = jax.checkpoint(body, prevent_cse=False)   # scan already keeps the copies apart
    x, ys = jax.lax.scan(body, x, (state, xs))
    return x if ys is None else (x, ys)


def call_layer(layer, x, *args, remat: bool = False, xs=None):
  """`layer(x, *args)`, rematerialised in the backward pass when `remat`; `layer` is a
  single layer or a `LayerStack` (whose per-layer inputs `xs` have a leading axis n; a
  single layer gets `xs` as its last argument as it is).

  The single layer's remat is `jax.checkpoint` over its split state: unlike `nnx.remat`
  it works under plain `jax.grad` of a merged module (the trainer's update step), where
  nnx.remat fails with a TraceContextError.
  """
  if isinstance(layer, LayerStack):
    return layer(x, *args, remat=remat, xs=xs)
  args = args if xs is None else (*args, xs)
  if not remat:
    return layer(x, *args)
  graphdef, state = nnx.split(layer)
  return jax.checkpoint(lambda state, x, args: nnx.merge(graphdef, state)(x, *args))(
      state, x, args)
