"""Sequence packing for the update step and the rollout forwards: no compute on padding.

A rollout batch is `[B, P + T]`: left-padded prompts, right-padded completions. With
long-tailed lengths most of it is padding, and every forward and backward pass computes
it. Packing lays the real tokens of several sequences end to end in rows of the same
length S = P + T, with segment ids so attention never crosses a sequence and positions
that restart per sequence (they are the padded layout's own positions, gathered), so each
real token sees exactly what it sees padded. The hidden state that predicts completion
token t of sequence b is gathered back to `[B, T]`, and everything downstream (log-probs,
losses, `aggregate`'s (sum, denominator) normalisation) runs on the usual layout: the
loss and its normaliser are the padded ones, so the gradient is the same up to float
summation order (the pitfall of verl-project/verl#5625, per-micro-batch means weighted by sequence
counts, cannot arise).

Rows are packed in groups: one group per (micro-batch, data shard), so a packed row and
the sequences it holds live on the same device. Within a group, first-fit decreasing puts
sequences into K rows; K is rounded up to a multiple of ceil(rows per group / 8), so at
most 8 programs are compiled per forward (google/tunix packs the same way, into a static
number of segments).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

BUCKETS = 8   # at most this many packed-row counts per group (compiled programs)


class PackLayout(NamedTuple):
  """Host arrays describing how B padded sequences sit in G·K packed rows of length S.

  Attributes:
    src: int32 [G·K, S], for each packed position the flat index into its group's
      padded sequences `[rows per group · S]` (-1: padding).
    segment: int32 [G·K, S], 1 + the sequence's index within its group (0: padding).
    hidden: int32 [B, T], flat index `k·S + s` within the row's group of the hidden state
      that predicts completion token t (the token before it).
  """
  src: np.ndarray
  segment: np.ndarray
  hidden: np.ndarray


def rows_per_pack(rows_per_group: int, needed: int) -> int:
  """K: `needed` rounded up to a multiple of ceil(rows_per_group / BUCKETS), ≤ rows_per_group."""
  step = max(1, math.ceil(rows_per_group / BUCKETS))
  return min(rows_per_group, -(-needed // step) * step)


def first_fit_decreasing(lengths, capacity: int) -> list[list[int]]:
  """Bins (lists of item indices) of total length ≤ capacity, longest items placed first."""
  bins, room = [], []
  for i in sorted(range(len(lengths)), key=lambda j: -lengths[j]):
    for k, free in enumerate(room):
      if lengths[i] <= free:
        bins[k].append(i)
        room[k] -= lengths[i]
        break
    else:
      bins.append([i])
      room.append(capacity - lengths[i])
  return bins


def pack_layout(prompt_lengths, completion_lengths, *, prompt_width: int, completion_width: int,
                groups: int) -> PackLayout:
  """The packing of B sequences (consecutive `groups` of B/groups rows each).

  Args:
    prompt_lengths: int [B], real prompt tokens (the last ones of the P prompt columns).
    completion_lengths: int [B], completion tokens to keep (the first ones of T).
    prompt_width, completion_width: P and T of the padded layout.
    groups: G; B must be a multiple of it.
  """
  p_len = np.asarray(prompt_lengths, np.int64)
  c_len = np.asarray(completion_lengths, np.int64)
  b, (p, t) = len(p_len), (prompt_width, completion_width)
  s = p + t
  if b % groups:
    raise ValueError(f"pack_layout: {b} rows do not split into {groups} groups")
  if (p_len < 1).any() or (p_len > p).any() or (c_len < 0).any() or (c_len > t).any():
    raise ValueError("pack_layout: lengths outside [1, P] / [0, T]")
  per = b // groups
  lengths = p_len + c_len
  bins = [first_fit_decreasing(lengths[g * per:(g + 1) * per], s) for g in range(groups)]
  k = rows_per_pack(per, max(len(x) for x in bins))
  src = np.full((groups * k, s), -1, np.int32)
  segment = np.zeros((groups * k, s), np.int32)
  hidden = np.zeros((b, t), np.int32)
  for g, group_bins in enumerate(bins):
    for row, members in enumerate(group_bins):
      col = 0
      for i in members:
        r = g * per + i
        first = p - p_len[r]                      # first real column of the padded row
        n = p_len[r] + c_len[r]
        src[g * k + row, col:col + n] = i * s + np.arange(first, first + n)
        segment[g * k + row, col:col + n] = i + 1
        # completion token t is predicted by the token before it: packed column
        # col + p_len - 1 + t (for padding positions t >= c_len, the last real token)
        steps = np.minimum(np.arange(t), max(c_len[r] - 1, 0))
        hidden[r] = row * s + col + p_len[r] - 1 + steps
        col += n
  return PackLayout(src, segment, hidden)


def layout_arrays(layout: PackLayout) -> dict:
  """The layout as the batch entries the packed forward reads."""
  return {"pack_src": layout.src, "pack_segment": layout.segment,
          "pack_hidden": layout.hidden}


def packed_inputs(tokens_bs, positions_bs, batch, groups: int):
  """Gathers the padded sequences `[B, S]` into packed rows: (tokens, positions, valid,
  segment ids), each `[G·K, S]`."""
  b, s = tokens_bs.shape
  src, segment = batch["pack_src"], batch["pack_segment"]
  per_group = lambda x: x.reshape(groups, (b // groups) * s)  # noqa: E731
  src_g = src.reshape(groups, -1)
  take = jax.vmap(lambda flat, idx: jnp.take(flat, jnp.maximum(idx, 0), axis=0))
  valid = (src >= 0).astype(jnp.int32)
  tokens = jnp.where(valid > 0, take(per_group(tokens_bs), src_g).reshape(src.shape), 0)
  positions = take(per_group(positions_bs), src_g).reshape(src.shape)
  return tokens, positions, valid, segment


def unpack_hidden(hidden_ksd, batch, groups: int):
  """Packed hidden states `[G·K, S, D]` -> the ones predicting each completion token
  `[B, T, D]` (`PackLayout.hidden`)."""
  k_all, s, d = hidden_ksd.shape
  index = batch["pack_hidden"]
  b, t = index.shape
  flat = hidden_ksd.reshape(groups, (k_all // groups) * s, d)
  idx = index.reshape(groups, (b // groups) * t)
  out = jax.vmap(lambda h, i: jnp.take(h, i, axis=0))(flat, idx)
  return out.reshape(b, t, d)
