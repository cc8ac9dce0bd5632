"""What a sampler call does on the host before its program runs: check the prompts, split
the model (cast to the sampler's dtype, scanned layers as per-layer views) and place the
rows and parameters on the mesh. Shared by `sampler`, `continuous` and `multiturn`."""

from __future__ import annotations

import functools
import gc
import logging
import time
import weakref
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rljax.models.stack_layout import per_layer_views
from rljax.parallel import BATCH_AXES, state_shardings


def check_prompts(prompt_tokens, prompt_mask, model=None) -> tuple[np.ndarray, np.ndarray]:
  """The prompts as int32 NumPy arrays, after checking their shapes, dtype, left padding and
  (with `model`) that every real token is an id of its vocabulary (XLA's gather would clamp
  an id out of range into a wrong embedding, silently)."""
  tokens_bp = np.asarray(prompt_tokens)
  mask_bp = np.asarray(prompt_mask)
  if tokens_bp.ndim != 2 or tokens_bp.shape != mask_bp.shape or 0 in tokens_bp.shape:
    raise ValueError(f"prompt_tokens {tokens_bp.shape} and prompt_mask {mask_bp.shape} must "
                     "both be non-empty [B, P]")
  if not np.issubdtype(tokens_bp.dtype, np.integer):
    raise TypeError(f"prompt_tokens must be integers, got {tokens_bp.dtype}")
  mask_bp = (mask_bp > 0).astype(np.int32)
  if not mask_bp.any(axis=1).all():
    raise ValueError("every prompt needs at least one real token (prompt_mask row of zeros)")
  if (np.diff(mask_bp, axis=1) < 0).any():
    raise ValueError("prompts must be left-padded (prompt_mask 0...0 1...1 per row)")
  vocab = getattr(getattr(model, "cfg", None), "vocab_size", None)
  real = tokens_bp[mask_bp > 0]
  if vocab and (real.min() < 0 or real.max() >= vocab):
    raise ValueError(f"prompt_tokens hold ids outside the model's vocabulary [0, {vocab}): "
                     f"{int(real.min())} .. {int(real.max())} (where prompt_mask is 1)")
  return tokens_bp.astype(np.int32), mask_bp


class SamplingSplit(NamedTuple):
  """`split_for_sampling`'s result: the graph and state a sampler program takes, and the
  arrays of that state the split made (views, cast copies), which the model does not own,
  with weak references to the host arrays the views read through."""
  graphdef: nnx.GraphDef
  state: nnx.State
  made: list


def split_for_sampling(model: nnx.Module, sampler_dtype, *,
                       layer_views: bool = False) -> SamplingSplit:
  """nnx.split, optionally into a copy with floating parameters and compute in `sampler_dtype`.

  `layer_views`: a model with scanned layers (`ModelConfig.scan_layers`) is split as the
  same model with one module per layer whose parameters are views of the stacked ones
  (`rljax.models.stack_layout.per_layer_views`; CPU only, else as it is). A decode step
  reads every layer's weights; from a stacked argument XLA CPU copied each layer's slice
  before the loop, a second copy of the weights for the whole call (Qwen2.5-0.5B: 1.4 of
  the program's 1.6 GB of temporaries; `tests/test_sampling_memory.py`). Only for a call
  that drops the views when it returns (`drop_sampling_copies`): while they live, an
  update step that donates the stacked parameters copies them instead.
  """
  graphdef, own_state = nnx.split(model)
  state, hosts = own_state, []
  if sampler_dtype is None:
    if layer_views:
      graphdef, state, hosts = _per_layer_views(model, graphdef, own_state)
  else:
    dtype = jnp.dtype(sampler_dtype)
    state = jax.tree.map(functools.partial(_cast_floating, dtype=dtype), own_state)
    cfg = getattr(model, "cfg", None)
    if cfg is not None and hasattr(cfg, "replace") and hasattr(cfg, "dtype"):
      graphdef = _graphdef_for(type(model), cfg.replace(dtype=dtype.name,
                                                        param_dtype=dtype.name))
  own = {id(x) for x in jax.tree.leaves(own_state)}
  made = [x for x in jax.tree.leaves(state) if isinstance(x, jax.Array) and id(x) not in own]
  return SamplingSplit(graphdef, state, made + hosts)


RELEASE_TIMEOUT_SECONDS = 5.0   # `drop_sampling_copies` warns after waiting this long


def drop_sampling_copies(made: list, out) -> None:
  """Deletes the arrays a `split_for_sampling` made (`SamplingSplit.made`: per-layer views
  of scanned parameters, cast copies), once the call's outputs `out` are ready. Not arrays
  placed from them: `jax.device_put` may alias.

  A view holds a reference to the stacked parameters' buffers, through a host array:
  until that is gone, an update step that donates them copies them instead (Qwen2.5-0.5B:
  1.4 GB more at that update's peak). Deleting a view drops it on a runtime thread, and
  JAX applies such releases to Python objects at its next garbage collection (its
  `gc.callbacks` hook): after some calls the host arrays lived on until then, so some
  updates copied and others did not (the toy GRPO benchmark: 1 step in 41, 8 of its 15
  parameter arrays; `benchmarks/README.md`, "Session 9"). This waits until they are gone
  (`SamplingSplit.made` holds weak references to them), running a young-generation
  collection between polls.
  """
  if not made:
    return
  jax.block_until_ready(out)
  hosts = [x for x in made if isinstance(x, weakref.ref)]
  for x in made:
    if isinstance(x, jax.Array):
      x.delete()
  deadline = time.monotonic() + RELEASE_TIMEOUT_SECONDS
  while any(h() is not None for h in hosts):
    if time.monotonic() > deadline:
      logging.warning("drop_sampling_copies: %d host arrays of per-layer views still alive "
                      "after %.0f s: the next donating update may copy the stacked "
                      "parameters", sum(h() is not None for h in hosts),
                      RELEASE_TIMEOUT_SECONDS)
      return
    gc.collect(0)   # runs JAX's callback, which applies the releases its threads queued
    time.sleep(0.0005)



def _cast_floating(x, dtype):
  if not jnp.issubdtype(x.dtype, jnp.floating):
    return x
  if isinstance(x, jax.ShapeDtypeStruct):   # an abstract model (`buckets.precompile`)
    return jax.ShapeDtypeStruct(x.shape, dtype, sharding=x.sharding)
  return x.astype(dtype)


def _per_layer_views(model, graphdef, state):
  cfg = getattr(model, "cfg", None)
  if not getattr(cfg, "scan_layers", False) or not hasattr(cfg, "replace"):
    return graphdef, state, []
  hosts = []
  views = per_layer_views(state, hosts)
  if views is None:
    return graphdef, state, []
  per_layer = _graphdef_for(type(model), cfg.replace(scan_layers=False))
  try:   # e.g. LoRA adapters, which the config does not describe: as it is
    same = jax.tree.structure(nnx.state(nnx.merge(per_layer, views))) == jax.tree.structure(
        views)
  except (ValueError, KeyError, TypeError):
    same = False
  return (per_layer, views, hosts) if same else (graphdef, state, [])


@functools.lru_cache(maxsize=32)
def _graphdef_for(cls, cfg):
  abstract = nnx.eval_shape(lambda: cls(cfg, rngs=nnx.Rngs(0)))
  return nnx.split(abstract)[0]


def _batch_sharding(mesh):
  """Rows split over the mesh's batch axes (`rljax.parallel.BATCH_AXES` present in it)."""
  axes = tuple(a for a in BATCH_AXES if a in mesh.axis_names)
  return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(axes or None))


def place_rows(mesh, tokens_rw, mask_rw, model):
  """Puts rows on the mesh's batch axes; a model whose parameters are not yet on the mesh
  comes back as a model whose parameters have the shardings of their logical axes
  (`rljax.parallel.state_shardings`)."""
  if mesh is None:
    return tokens_rw, mask_rw, model
  rows = _batch_sharding(mesh)
  tokens_rw, mask_rw = jax.device_put(tokens_rw, rows), jax.device_put(mask_rw, rows)
  graphdef, state = nnx.split(model)
  on_mesh = all(isinstance(getattr(x, "sharding", None), jax.sharding.NamedSharding)
                and x.sharding.mesh == mesh for x in jax.tree.leaves(state))
  if not on_mesh:
    model = nnx.merge(graphdef, jax.device_put(state, state_shardings(state, mesh)))
  return tokens_rw, mask_rw, model
