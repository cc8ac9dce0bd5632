"""How the static sampler's decode loop is cut into segments over growing KV caches
(`rljax.sampling.decode.decode_segments`): where the segments end, and how many pay for
themselves (each is another copy of the decode step in the compiled program)."""

from __future__ import annotations

import jax

# Up to MAX_SEGMENTS while_loops over growing KV caches: attention reads the whole cache
# every step, so early segments with shorter caches are cheaper (10 % faster decode at batch
# 8, 20 % at batch 64 on the benchmark's small model). Each is another copy of the decode
# body in the program: at Qwen2.5-0.5B's shapes (batch 8 x 128 tokens) one loop instead of
# four compiled in ~3 s less and left ~95 MB less resident, and the static sampler decoded
# ~2 % slower (the byte count below says 0.5 %: CPU attention costs more per byte than
# streaming the weights), the continuous one no slower (benchmarks/decode_segments.py;
# benchmarks/README.md, "Session 9").
MAX_SEGMENTS = 4
MIN_SEGMENT_SAVING = 0.02


def array_bytes(tree) -> int:
  """Bytes of the arrays (or abstract arrays) in `tree`."""
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


def segment_count(weight_bytes: int, slot_bytes: int, p: int, t_max: int) -> int:
  """MAX_SEGMENTS when decoding in segments saves at least MIN_SEGMENT_SAVING of what the
  decode steps read, else 1 (one loop over the whole cache).

  A decode step reads every weight once and, in attention, the cache up to its window
  (`slot_bytes` per slot, all layers' keys and values); a segment ending at step e has a
  window of p + e - 1 slots. Batch 8 x 128 tokens on Qwen2.5-0.5B's weights (1.9 GB) reads
  a 38 MB cache: segments would save 0.5 %; the benchmark's small model at batch 64 saves
  most of its reads.
  """
  ends = segment_ends(t_max, max_segments=MAX_SEGMENTS)
  full = p + t_max - 1
  read = sum((end - start) * (p + end - 1) for start, end in zip([1, *ends], ends))
  saved = slot_bytes * (full * max(t_max - 1, 0) - read)
  total = (weight_bytes + slot_bytes * full) * max(t_max - 1, 1)
  return len(ends) if saved >= MIN_SEGMENT_SAVING * total else 1


def segment_ends(t_max: int, *, max_segments: int = 4, min_length: int = 16) -> list[int]:
  """Exclusive ends of the decode segments over steps 1..t_max-1 (equal lengths).

  Each segment is one `while_loop` over a KV cache just long enough for its last step,
  so attention (which reads the whole cache every step) costs ~(P + T/2)/(P + T) less
  on average; every segment is another copy of the decode body to compile, hence the cap.
  """
  count = max(1, min(max_segments, (t_max - 1) // min_length))
  return [1 + -(-(t_max - 1) * (i + 1) // count) for i in range(count)]

