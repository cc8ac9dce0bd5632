"""Host memory on the CPU: keep what XLA frees for its next call instead of faulting it in
again (opt-in: RLJAX_KEEP_FREED_MEMORY=1, applied when `rljax` is imported)."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

# glibc's mallopt parameters (<malloc.h>)
_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8
OPT_IN_ENV = "RLJAX_KEEP_FREED_MEMORY"
_kept = False


def keep_freed_host_memory() -> bool:
  """Makes glibc's malloc serve large blocks from its heap and keep them after `free`.

  XLA CPU allocates all of a compiled program's temporaries as one block per call (546 MB
  per device for the GRPO benchmark's toy update step). glibc serves any block above its
  mmap threshold (at most 32 MB) with a fresh `mmap` and returns it with `munmap`, so every
  call faults the whole block in again, 4 KB at a time: 267,000 minor page faults and
  0.5 CPU-seconds in the kernel per toy update step on 2 devices. With `mmap` off
  (M_MMAP_MAX = 0), trimming off (M_TRIM_THRESHOLD = -1) and one malloc arena
  (M_ARENA_MAX = 1; a thread's own arena would still `mmap` such a block), the block comes
  from the heap and later calls reuse it: that update step ran 1.40 -> 1.26 s.

  Opt-in, because it is not free (measured, `benchmarks/README.md`, "Page faults"): all
  threads share one malloc lock, which made the sampler-heavy main job
  (`experiments/grpo.py`, one device) 10-20 % slower; freed memory is not returned to the
  OS and the heap can outgrow the live blocks. It pays off where calls have temporaries of
  hundreds of MB. Setting RLJAX_KEEP_FREED_MEMORY=1 applies it at `import rljax`, before
  JAX starts its threads; a direct call must also come before then (a thread that already
  has its own arena keeps it). Linux with glibc only.

  Returns:
    Whether the settings are in force (also on a second call).
  """
  global _kept
  if _kept or not sys.platform.startswith("linux"):
    return _kept
  try:
    mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
  except (OSError, AttributeError):   # not glibc
    return False
  mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
  settings = ((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, -1))
  _kept = all(mallopt(param, value) == 1 for param, value in settings)
  return _kept


def keep_freed_host_memory_if_asked() -> bool:
  """`keep_freed_host_memory()` when RLJAX_KEEP_FREED_MEMORY=1; whether it is in force."""
  if os.environ.get(OPT_IN_ENV, "0").strip() == "1":
    return keep_freed_host_memory()
  return _kept
