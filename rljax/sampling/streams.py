"""The sampler's random numbers: one uniform per row and draw, from streams that name the
row (prompt, sample index) rather than its place in a batch, so a row's draws do not change
with batch size, padding, sharding or how a continuous sampler schedules it."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp


def default_streams(rows: int, group: int = 1) -> jax.Array:
  """The stream of each row when rows come in groups of `group` samples of one prompt:
  (prompt index r // group, sample index r % group), int32 [R, 2]."""
  r = jnp.arange(rows, dtype=jnp.int32)
  return jnp.stack([r // group, r % group], axis=1)


def stream_uniforms(key: jax.Array, streams_r2: jax.Array, steps: int) -> jax.Array:
  """u in (0, 1] for draw t = 0..steps-1 of every row: row r's t-th draw reads
  `fold_in(fold_in(fold_in(key, s0), s1), t)` with its stream (s0, s1) = streams_r2[r].

  A row's randomness is a function of (key, stream, t) alone: not of its position in the
  batch, the batch size, padding or sharding. With streams (prompt, sample index), sample j
  of prompt p draws the same numbers in every run that shares the key (common random
  numbers: arms of an ablation that differ in a trick, a batch size or the group size n see
  the same sampling noise wherever their policies agree).

  Args:
    key: PRNG key.
    streams_r2: int32 [R, 2].
    steps: T.
  Returns:
    float32 [T, R].
  """
  row_keys = _stream_keys(key, streams_r2)
  return jax.vmap(lambda t: jax.vmap(lambda k: _draw_at(k, t))(row_keys))(jnp.arange(steps))


def stream_uniforms_at(key: jax.Array, streams_r2: jax.Array, draw_r: jax.Array) -> jax.Array:
  """Row r's draw number `draw_r[r]` of its stream: `stream_uniforms(...)[draw_r[r], r]`
  without the table (rows that draw at different paces, e.g. multi-turn episodes).

  Returns:
    float32 [R].
  """
  return jax.vmap(_draw_at)(_stream_keys(key, streams_r2), draw_r)


def _stream_keys(key, streams_r2):
  chex.assert_shape(streams_r2, (None, 2))
  return jax.vmap(lambda s: jax.random.fold_in(jax.random.fold_in(key, s[0]), s[1]))(streams_r2)


def _draw_at(row_key, t):
  return 1.0 - jax.random.uniform(jax.random.fold_in(row_key, t), (), jnp.float32)


def row_uniforms(key: jax.Array, rows: int) -> jax.Array:
  """u in (0, 1] for rows 0..rows-1; row b's value depends only on (key, b) (JAX's
  partitionable threefry), so it does not change with batch padding or sharding."""
  return 1.0 - jax.random.uniform(key, (rows,), jnp.float32)
