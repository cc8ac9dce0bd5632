"""Host memory on the CPU: XLA's temporaries in blocks that glibc keeps for the next call,
instead of pages faulted in anew on every call (opt-in: RLJAX_KEEP_FREED_MEMORY=1, applied
when `rljax` is imported); and, otherwise, the memory a compilation freed handed back to the
OS (`release_freed_host_memory`)."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

# glibc's mallopt parameters (<malloc.h>) and its ceiling on the mmap threshold (64-bit)
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
_MMAP_THRESHOLD_MAX = 32 * 1024 * 1024
HEAP_FLAG = "--xla_multiheap_size_constraint_per_heap"
ENV = "RLJAX_KEEP_FREED_MEMORY"
_kept = False


def keep_freed_host_memory() -> bool:
  """Splits XLA's temporaries into blocks of at most 16 MB and has glibc keep freed blocks.

  XLA CPU allocates all of a compiled program's temporaries as one block per call (546 MB
  per device for the GRPO benchmark's toy update step). glibc serves any block above its
  mmap threshold (at most 32 MB) with a fresh `mmap` and returns it with `munmap`, so every
  call faulted the whole block in again, 4 KB at a time: 267,000 minor page faults and
  0.5 CPU-seconds in the kernel per toy update step on 2 devices. Here:

  - XLA_FLAGS gets `--xla_multiheap_size_constraint_per_heap=16777216`: the temporaries
    become several blocks of at most 16 MB (a larger single buffer keeps its own block);
  - glibc's mmap threshold is pinned at its 32 MB ceiling (M_MMAP_THRESHOLD), trimming is
    off (M_TRIM_THRESHOLD = -1) and 64 MB are kept at the top of every heap (M_TOP_PAD:
    without it, a thread's heap that empties out between calls is unmapped), so such
    blocks come from malloc's heaps and stay there for the next call.

  Measured (`benchmarks/README.md`, "Page faults"; `python benchmarks/grpo_vs_trl.py
  --host-memory glibc|keep-freed`): the toy update step 1.42 -> 1.17-1.20 s on 2 devices,
  page faults 267,000 -> under 400 per step; the main job
  (`experiments/grpo.py`) unchanged; at Qwen2.5-0.5B's shapes the update 30.8 -> 27.5 s.
  The values computed are the same (buffer placement only). The cost, and why it is
  opt-in: a buffer larger than 16 MB gets a block of its own and no longer shares memory
  with buffers whose lifetimes do not overlap it (0.5B update: XLA temporaries 7.4 ->
  11.3 GB, peak RSS 14.9 -> 19.1 GB; the toy's are unchanged); freed heap memory is not
  returned to the OS.

  Must run before JAX starts its backend (XLA reads XLA_FLAGS once): set
  RLJAX_KEEP_FREED_MEMORY=1 and `import rljax` calls it. Linux with glibc only.

  Returns:
    Whether the allocator settings are in force (also on a second call).
  """
  global _kept
  if _kept or not sys.platform.startswith("linux"):
    return _kept
  try:
    mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
  except (OSError, AttributeError):   # not glibc
    return False
  flags = os.environ.get("XLA_FLAGS", "")
  if HEAP_FLAG not in flags:
    os.environ["XLA_FLAGS"] = f"{flags} {HEAP_FLAG}={_MMAP_THRESHOLD_MAX // 2}".strip()
  mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
  settings = ((_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX), (_M_TRIM_THRESHOLD, -1),
              (_M_TOP_PAD, 2 * _MMAP_THRESHOLD_MAX))
  _kept = all(mallopt(param, value) == 1 for param, value in settings)
  return _kept


def keep_freed_host_memory_if_asked() -> bool:
  """`keep_freed_host_memory()` when RLJAX_KEEP_FREED_MEMORY=1; whether it is in force."""
  if os.environ.get(ENV, "").strip() == "1":
    return keep_freed_host_memory()
  return _kept


def _libc():
  if not sys.platform.startswith("linux"):
    return None
  try:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
  except OSError:
    return None


def release_freed_host_memory() -> bool:
  """Returns the free memory at the top and inside glibc's heaps to the OS (`malloc_trim(0)`).

  XLA's compiler allocates and frees hundreds of MB of small blocks (HLO passes, LLVM);
  glibc keeps freed blocks inside its heaps, so after a compilation the process stays that
  much larger for its whole life. Measured on Qwen2.5-0.5B's static sampler
  (`benchmarks/README.md`, "Peak memory, where it went"): 2,585 MB resident right after
  compiling, 2,429 MB after this call. The sampled values are the same (no buffer moves).
  Nothing to do, and not called, while `keep_freed_host_memory` is in force (it keeps freed
  memory on purpose).

  Returns:
    Whether glibc's malloc_trim ran and released memory (False elsewhere, or with nothing
    to release, or while freed memory is kept).
  """
  libc = _libc()
  if _kept or libc is None or not hasattr(libc, "malloc_trim"):
    return False
  libc.malloc_trim.argtypes, libc.malloc_trim.restype = (ctypes.c_size_t,), ctypes.c_int
  return libc.malloc_trim(0) == 1
