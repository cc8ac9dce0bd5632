"""Left-padding of prompt token lists into fixed-shape NumPy batches."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

DEFAULT_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


def bucket_length(n: int, buckets: Sequence[int] = DEFAULT_BUCKETS) -> int:
  """Smallest bucket >= n, so jit sees few distinct prompt lengths.

  Raises:
    ValueError: if n exceeds the largest bucket.
  """
  for b in sorted(buckets):
    if b >= n:
      return int(b)
  raise ValueError(f"length {n} exceeds the largest bucket {max(buckets)}")


def left_pad(seqs: Sequence[Sequence[int]], *, pad_id: int, length: int | None = None,
             buckets: Sequence[int] = DEFAULT_BUCKETS) -> tuple[np.ndarray, np.ndarray]:
  """Left-pads token id lists so that every prompt ends at the last column.

  Args:
    seqs: B lists of token ids (each non-empty).
    pad_id: id written into padding positions.
    length: the padded length P; default: `bucket_length(longest, buckets)`.
    buckets: allowed lengths when `length` is None.
  Returns:
    tokens: int32 [B, P], padding on the left.
    mask: int32 [B, P], 1 on real tokens, 0 on padding.
  Raises:
    ValueError: on an empty batch, an empty sequence, or a sequence longer than `length`.
  """
  if len(seqs) == 0:
    raise ValueError("left_pad: empty batch")
  lens = [len(s) for s in seqs]
  if min(lens) == 0:
    raise ValueError(f"left_pad: sequence {lens.index(0)} is empty")
  p = bucket_length(max(lens), buckets) if length is None else int(length)
  if max(lens) > p:
    i = int(np.argmax(lens))
    raise ValueError(f"left_pad: sequence {i} has {lens[i]} tokens > length {p}")
  tokens = np.full((len(seqs), p), pad_id, dtype=np.int32)
  mask = np.zeros((len(seqs), p), dtype=np.int32)
  for i, s in enumerate(seqs):
    tokens[i, p - len(s):] = np.asarray(s, dtype=np.int32)
    mask[i, p - len(s):] = 1
  return tokens, mask
