"""Shape buckets, the compile counter of the sampler, and compiling ahead of the weights.

Prompt width and row count are rounded up to a bucket so that a training loop whose
batches vary a little compiles a handful of programs once and never again.
"""

from __future__ import annotations

import math

import jax
import numpy as np

from rljax.host_memory import release_freed_host_memory

_TRACES = [0]
_COMPILE_ONLY = [False]


def compile_count() -> int:
  """Number of sampler programs compiled (traced) in this process so far."""
  return _TRACES[0]


def _note_trace() -> None:
  _TRACES[0] += 1


def call_releasing(fn, *args, **kwargs):
  """`fn(*args, **kwargs)` for a jitted sampler program; when the call compiled a new one,
  the host memory the compiler freed goes back to the OS
  (`rljax.host_memory.release_freed_host_memory`: -156 MB resident at Qwen2.5-0.5B's shapes).
  Under `precompile`: only compiles (the arguments may be abstract) and returns zeros
  shaped like the outputs.
  """
  traced = compile_count()
  if _COMPILE_ONLY[0]:
    out_info = fn.lower(*args, **kwargs).compile().out_info
    out = jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), out_info)
  else:
    out = fn(*args, **kwargs)
  if compile_count() != traced:
    release_freed_host_memory()
  return out


def precompile(sample, *args, **kwargs) -> int:
  """Compiles the program(s) `sample(*args, **kwargs)` would run, without running them.

  `sample` is a sampler entry point (`generate`, `generate_rows`,
  `rljax.sampling.continuous.generate_continuous`, `continuous_rows`) and the arguments
  those of the calls to come; the model may be abstract (`nnx.eval_shape`, e.g. before
  `rljax.models.load_hf`): the compiler's memory peak (+330 MB for Qwen2.5-0.5B's static
  sampler, +700 MB for the continuous one) then comes and goes before the parameters are
  resident instead of on top of them. The calls to come reuse the compiled program (JAX's
  own caches: no second compilation); the prompts' values, like the parameters', do not
  matter, only their shapes (after bucketing) and the call's static settings.

  Note: abstract parameters must be unsharded (no mesh); with a mesh, pass the model.

  Returns:
    the number of programs compiled (0: all were already); the sampler's return value,
    zeros shaped like its outputs, is dropped.
  """
  traced = compile_count()
  _COMPILE_ONLY[0] = True
  try:
    sample(*args, **kwargs)
  finally:
    _COMPILE_ONLY[0] = False
  return compile_count() - traced


def round_up(size: int, bucket, *, multiple_of: int = 1) -> int:
  """Rounds `size` up to its bucket.

  Args:
    size: the true size (>= 1).
    bucket: "pow2" (next power of two), an int m (next multiple of m), or None (exact).
    multiple_of: the result is also a multiple of this (e.g. the number of data shards).
  Returns:
    the bucketed size, >= size.
  """
  if bucket is None:
    out = size
  elif bucket == "pow2":
    out = 1 << max(0, math.ceil(math.log2(max(size, 1))))
  elif isinstance(bucket, int) and bucket >= 1:
    out = -(-size // bucket) * bucket
  else:
    raise ValueError(f"bucket must be 'pow2', a positive int or None, got {bucket!r}")
  return -(-out // multiple_of) * multiple_of


def pad_prompts(tokens_bp: np.ndarray, mask_bp: np.ndarray, *, rows: int, width: int,
                pad_id: int) -> tuple[np.ndarray, np.ndarray]:
  """Left-pads prompts to `width` columns and appends padding rows up to `rows`.

  Padding rows get one real (pad-id) token in the last column so that no attention row
  is empty; their output is dropped.

  Args:
    tokens_bp: int [B, P] left-padded prompt tokens.
    mask_bp: int [B, P], 1 on real tokens.
    rows: R >= B.
    width: W >= P.
    pad_id: token id used for padding.
  Returns:
    (tokens [R, W] int32, mask [R, W] int32).
  """
  b, p = tokens_bp.shape
  tokens_rw = np.full((rows, width), pad_id, np.int32)
  mask_rw = np.zeros((rows, width), np.int32)
  tokens_rw[:b, width - p:] = tokens_bp
  mask_rw[:b, width - p:] = mask_bp
  mask_rw[b:, -1] = 1
  return tokens_rw, mask_rw
