"""Host memory on the CPU: XLA's per-call temporaries in transparent huge pages (the `rljax`
command's default, `huge_pages_environ`), or in blocks that glibc keeps for the next call
(opt-in: RLJAX_KEEP_FREED_MEMORY=1, applied when `rljax` is imported), instead of 4 KB pages
faulted in anew on every call; and the memory a compilation freed handed back to the OS
(`release_freed_host_memory`)."""

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
HUGE_PAGES_TUNABLE = "glibc.malloc.hugetlb=1"
HUGE_PAGES_ENV = "RLJAX_HUGE_PAGES"   # "0": the `rljax` command leaves glibc's defaults
_THP_MODE_FILE = "/sys/kernel/mm/transparent_hugepage/enabled"
BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"   # jax.monitoring's
RELEASE_AFTER_COMPILE_SECONDS = 0.5
_kept = False
_releasing_after_compiles = False


def transparent_huge_pages_mode(path: str = _THP_MODE_FILE) -> str:
  """The kernel's transparent-huge-page mode (`always`, `madvise`, `never`; "" if unknown)."""
  try:
    with open(path) as f:
      text = f.read()
  except OSError:
    return ""
  return text[text.find("[") + 1:text.find("]")] if "[" in text else ""


def _glibc_at_least(major: int, minor: int) -> bool:
  try:
    name, version = os.confstr("CS_GNU_LIBC_VERSION").split()
  except (AttributeError, ValueError, OSError):   # not glibc (musl, macOS, Windows)
    return False
  return name == "glibc" and tuple(int(x) for x in version.split(".")[:2]) >= (major, minor)


def huge_pages_environ(environ, *, thp_mode: str | None = None):
  """`environ` with glibc's transparent-huge-page tunable added, or None when there is nothing
  to do: already set, turned off (RLJAX_HUGE_PAGES=0), or unable to act here (not glibc >=
  2.35, or the kernel's mode is `never`).

  XLA CPU allocates a compiled program's temporaries as one block per call (546 MB per
  device for the toy GRPO update step); glibc serves a block above its mmap threshold (at
  most 32 MB) with a fresh `mmap` and unmaps it afterwards, so every call faults the block
  in again, 4 KB at a time (273,000 minor faults, 0.22 kernel CPU-s per toy GRPO step).
  `glibc.malloc.hugetlb=1` makes glibc `madvise(MADV_HUGEPAGE)` the memory it maps, so the
  kernel backs it with 2 MB pages: 512x fewer faults (941 per step, 0.05 kernel CPU-s),
  the same buffers, freed as before, so the peak memory does not grow (unlike
  `keep_freed_host_memory`). glibc reads tunables only when a process starts:
  `exec_with_huge_pages` re-executes the `rljax` command with it.

  Args:
    environ: the environment to extend (not modified).
    thp_mode: the kernel's mode (default: read from /sys).
  """
  thp_mode = transparent_huge_pages_mode() if thp_mode is None else thp_mode
  tunables = environ.get("GLIBC_TUNABLES", "")
  if (HUGE_PAGES_TUNABLE.split("=")[0] in tunables or environ.get(HUGE_PAGES_ENV) == "0"
      or thp_mode not in ("always", "madvise") or not _glibc_at_least(2, 35)):
    return None
  return {**environ, "GLIBC_TUNABLES": ":".join(filter(None, [tunables, HUGE_PAGES_TUNABLE]))}


def exec_with_huge_pages() -> None:
  """Re-executes this process (same interpreter and arguments) with glibc's huge-page
  tunable when `huge_pages_environ` gives an environment; returns when it does not.
  Called first by the `rljax` command, before JAX is imported."""
  environ = huge_pages_environ(os.environ)
  if environ is None or not getattr(sys, "orig_argv", None):
    return
  sys.stdout.flush()
  sys.stderr.flush()
  try:
    os.execve(sys.executable, sys.orig_argv, environ)
  except OSError:   # exec refused (sandbox): run on with glibc's defaults
    return


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


def release_after_long_compiles() -> None:
  """From now on, every XLA compilation of at least `RELEASE_AFTER_COMPILE_SECONDS` hands
  the memory it freed back to the OS (`release_freed_host_memory`) before its program
  first runs (a `jax.monitoring` listener on `BACKEND_COMPILE_EVENT`). Idempotent; called
  by `import rljax.sampling`.

  The first call of a big program compiles it and then runs it: without this, the
  compiler's freed blocks stay resident beside the run's own peak. Measured on the
  Qwen2.5-0.5B GRPO worker (`benchmarks/real_shapes.py --parts grpo`): its peak fell
  13,499 -> 12,571 MB in one run (13,919 in the next: benchmarks/README.md, "Session 7")
  with this and the update step's memory order
  (`rljax.parallel.low_memory_compiler_options`), whose XLA temporaries fell 676 MB; the
  rest, about 250 MB, is this release. Short compilations (most of a test suite's) are
  left alone: they free little and a trim walks the whole heap.
  """
  global _releasing_after_compiles
  if _releasing_after_compiles:
    return
  from jax import monitoring

  def on_duration(event: str, seconds: float, **_):
    if event == BACKEND_COMPILE_EVENT and seconds >= RELEASE_AFTER_COMPILE_SECONDS:
      release_freed_host_memory()

  monitoring.register_event_duration_secs_listener(on_duration)
  _releasing_after_compiles = True
