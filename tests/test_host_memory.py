"""`rljax.host_memory`: with RLJAX_KEEP_FREED_MEMORY=1, XLA CPU's per-call temporaries stop
being faulted in anew.

Each case runs in a fresh process (`import rljax` applies the settings, before JAX starts
its backend). The program keeps six 8 MB temporaries live at once: XLA allocates them as
one block per call, above glibc's largest mmap threshold (32 MB), so with glibc's
defaults every call maps its temporaries afresh and touches each 4 KB page again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rljax.host_memory import HEAP_FLAG

PROGRAM = r"""
import json, resource, sys
from rljax.host_memory import keep_freed_host_memory_if_asked
kept = keep_freed_host_memory_if_asked()
import jax, jax.numpy as jnp

@jax.jit
def f(x):   # six 8 MB temporaries, all live at the end: 48 MB
  ys = [jax.lax.optimization_barrier(x * float(i + 1)) for i in range(6)]
  return sum(jnp.sum(y * y[::-1]) for y in ys)

x = jnp.ones((2 * 1024 * 1024,), jnp.float32)
values = [float(f(x)) for _ in range(8)]   # compile, then calls until the heap settles
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
values += [float(f(x)) for _ in range(16)]
faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 16
print(json.dumps({"kept": kept, "faults_per_call": faults, "values": values}))
"""

PAGES_PER_CALL = 6 * 8 * 1024 * 1024 // 4096


def run(keep: str | None, program: str = PROGRAM) -> dict:
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env.pop("RLJAX_KEEP_FREED_MEMORY", None)
  # this test process imported rljax too: start from XLA_FLAGS without its setting
  env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split()
                              if not f.startswith(HEAP_FLAG))
  if keep is not None:
    env["RLJAX_KEEP_FREED_MEMORY"] = keep
  proc = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True,
                        text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr
  return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_kept_memory_is_not_faulted_in_again_and_results_are_unchanged():
  glibc = run(keep=None)   # the default
  kept = run(keep="1")
  assert glibc["kept"] is False and kept["kept"] is True
  # glibc's default: every call faults its temporaries in (seen: 22,530 pages per call)
  assert glibc["faults_per_call"] > PAGES_PER_CALL, glibc
  # kept: the blocks come from malloc's heaps and stay there (seen: 2 to 515 per call)
  assert kept["faults_per_call"] < PAGES_PER_CALL / 2, (kept, glibc)
  assert kept["values"] == glibc["values"]
  assert len(set(kept["values"])) == 1


STATE = ("import json, os; from rljax.host_memory import keep_freed_host_memory_if_asked; "
         "print(json.dumps({'kept': keep_freed_host_memory_if_asked(), "
         "'flags': os.environ.get('XLA_FLAGS', '')}))")


@pytest.mark.parametrize("keep, applied", [(None, False), ("0", False), ("1", True)])
def test_applied_when_asked(keep, applied):
  state = run(keep, program=STATE)
  assert state["kept"] is applied
  assert ("--xla_multiheap_size_constraint_per_heap=16777216" in state["flags"]) is applied


RELEASE = r"""
import ctypes, json
from rljax.host_memory import release_freed_host_memory

def rss_mb():
  return next(int(line.split()[1]) for line in open("/proc/self/status")
              if line.startswith("VmRSS:")) / 1024

libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)
blocks = [libc.malloc(64 * 1024) for _ in range(1024)]   # 64 MB below the mmap threshold
for b in blocks:
  ctypes.memset(b, 1, 64 * 1024)
for b in blocks[:-1]:   # the last one stays: the freed ones are not at the heap's top
  libc.free(b)
freed = rss_mb()
released = release_freed_host_memory()
print(json.dumps({"released": released, "drop_mb": freed - rss_mb()}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_release_returns_freed_heap_blocks_to_the_os():
  """64 MB freed inside glibc's heap stay resident until `release_freed_host_memory`."""
  env = {**os.environ, "RLJAX_KEEP_FREED_MEMORY": "0"}
  proc = subprocess.run([sys.executable, "-c", RELEASE], capture_output=True, text=True,
                        env=env, check=True)
  out = json.loads(proc.stdout.strip().splitlines()[-1])
  assert out["released"] and out["drop_mb"] > 48, out


def test_sampler_releases_after_a_compile_only(monkeypatch):
  """`generate` calls the release after a call that compiled, not after a cached one."""
  import jax
  import numpy as np
  from flax import nnx

  from rljax.models import Decoder
  from rljax.models.testing import tiny_config
  from rljax.sampling import SamplingParams, buckets, generate

  calls = []
  monkeypatch.setattr(buckets, "release_freed_host_memory", lambda: calls.append(1))
  model = Decoder(tiny_config(), rngs=nnx.Rngs(0))
  tokens, mask = np.ones((2, 4), np.int32), np.ones((2, 4), np.int32)
  sp = SamplingParams(max_new_tokens=3, temperature=1.0)
  count = buckets.compile_count()
  generate(model, tokens, mask, sampling=sp, rng=jax.random.key(0))
  generate(model, tokens, mask, sampling=sp, rng=jax.random.key(1))
  assert len(calls) == buckets.compile_count() - count == 1
  generate(model, tokens, mask, sampling=sp.replace(max_new_tokens=4), rng=jax.random.key(1))
  assert len(calls) == 2


def test_import_rljax_does_not_import_jax():
  """A script may set JAX's environment (JAX_ENABLE_COMPILATION_CACHE, XLA_FLAGS) after
  `import rljax` and before importing JAX (benchmarks/profile_ops.py does)."""
  code = "import sys, rljax; print('jax' in sys.modules)"
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert out.stdout.strip() == "False", out.stdout + out.stderr


def test_long_compiles_release_before_the_first_run(monkeypatch):
  """`import rljax.sampling` listens for JAX's backend-compile event: a compilation of at least
  `RELEASE_AFTER_COMPILE_SECONDS` calls the release, a shorter one does not; and a real
  compilation records that event (so the listener hears JAX's name for it)."""
  import jax
  import jax.numpy as jnp
  from jax import monitoring

  import rljax.sampling  # noqa: F401  (registers the listener)
  from rljax import host_memory

  calls, heard = [], []
  monkeypatch.setattr(host_memory, "release_freed_host_memory", lambda: calls.append(1))
  host_memory.release_after_long_compiles()   # already listening: not registered twice
  event = host_memory.BACKEND_COMPILE_EVENT
  monitoring.record_event_duration_secs(event, host_memory.RELEASE_AFTER_COMPILE_SECONDS)
  assert calls == [1]
  monitoring.record_event_duration_secs(event, 0.01)
  monitoring.record_event_duration_secs("/jax/some/other_event", 5.0)
  assert calls == [1]
  monitoring.register_event_duration_secs_listener(lambda e, s, **_: heard.append(e))
  jax.jit(lambda x: jnp.sin(x) * 3.0 + 0.25)(jnp.arange(7.0)).block_until_ready()
  assert event in heard


# --- transparent huge pages (the `rljax` command's default) ---------------------------

def _thp_ready() -> str:
  """Why the huge-page tunable cannot act here ("" when it can)."""
  from rljax import host_memory
  if not sys.platform.startswith("linux"):
    return "glibc only"
  if host_memory.huge_pages_environ({}) is None:
    return (f"glibc >= 2.35 and transparent huge pages needed (kernel mode "
            f"{host_memory.transparent_huge_pages_mode()!r})")
  return ""


@pytest.mark.skipif(bool(_thp_ready()), reason=_thp_ready() or "-")
def test_huge_pages_cut_the_faults_and_leave_the_values():
  from rljax.host_memory import huge_pages_environ
  glibc = run(keep=None)
  env = huge_pages_environ({})
  huge = run_env(env["GLIBC_TUNABLES"])
  # 4 KB pages: every call faults its 48 MB in (seen: 22,530 per call); 2 MB pages: 512x
  # fewer (seen: ~30); 1/8 leaves room for pages the kernel cannot back with a huge page
  assert glibc["faults_per_call"] > PAGES_PER_CALL
  assert huge["faults_per_call"] < PAGES_PER_CALL / 8, (huge, glibc)
  assert huge["values"] == glibc["values"]


def run_env(tunables: str) -> dict:
  """`run(keep=None)` with GLIBC_TUNABLES set for the child."""
  old = os.environ.get("GLIBC_TUNABLES")
  os.environ["GLIBC_TUNABLES"] = tunables
  try:
    return run(keep=None)
  finally:
    if old is None:
      os.environ.pop("GLIBC_TUNABLES")
    else:
      os.environ["GLIBC_TUNABLES"] = old


def test_huge_pages_environ_adds_the_tunable_once():
  from rljax.host_memory import HUGE_PAGES_TUNABLE, huge_pages_environ
  if huge_pages_environ({}, thp_mode="madvise") is None:
    pytest.skip("not glibc >= 2.35")
  env = huge_pages_environ({"PATH": "/bin"}, thp_mode="madvise")
  assert env == {"PATH": "/bin", "GLIBC_TUNABLES": HUGE_PAGES_TUNABLE}
  # other tunables are kept, colon-separated as glibc reads them
  env = huge_pages_environ({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, thp_mode="always")
  assert env["GLIBC_TUNABLES"] == f"glibc.malloc.arena_max=2:{HUGE_PAGES_TUNABLE}"
  # nothing to do: already set (even to 0: the user's choice), turned off, or THP off
  assert huge_pages_environ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, thp_mode="madvise") is None
  assert huge_pages_environ({"RLJAX_HUGE_PAGES": "0"}, thp_mode="madvise") is None
  assert huge_pages_environ({}, thp_mode="never") is None
  assert huge_pages_environ({}, thp_mode="") is None


def test_thp_mode_is_read_from_the_bracket(tmp_path):
  from rljax.host_memory import transparent_huge_pages_mode
  f = tmp_path / "enabled"
  f.write_text("always [madvise] never\n")
  assert transparent_huge_pages_mode(str(f)) == "madvise"
  assert transparent_huge_pages_mode(str(tmp_path / "absent")) == ""


REEXEC = ("import os; from rljax.host_memory import exec_with_huge_pages; "
          "exec_with_huge_pages(); print(os.environ.get('GLIBC_TUNABLES', ''))")


@pytest.mark.skipif(bool(_thp_ready()), reason=_thp_ready() or "-")
@pytest.mark.parametrize("off, expected", [(None, "glibc.malloc.hugetlb=1"), ("0", "")])
def test_the_command_reexecutes_itself_with_the_tunable(off, expected):
  env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "RLJAX_HUGE_PAGES")}
  if off is not None:
    env["RLJAX_HUGE_PAGES"] = off
  proc = subprocess.run([sys.executable, "-c", REEXEC], env=env, capture_output=True,
                        text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.strip() == expected   # printed once: one re-execution, no loop
