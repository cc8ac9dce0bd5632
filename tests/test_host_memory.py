"""`rljax.host_memory`: with RLJAX_KEEP_FREED_MEMORY=1, XLA CPU's per-call temporaries
stop being faulted in anew.

Each case runs in a fresh process (the allocator setting is process-wide; `import rljax`
applies it, before JAX starts its threads). The program materialises 64 MB temporaries
(16 M floats behind an optimization barrier), above glibc's largest mmap threshold
(32 MB), so with glibc's defaults every call maps them afresh and touches each 4 KB page.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PROGRAM = r"""
import json, resource, sys
from rljax.host_memory import keep_freed_host_memory_if_asked
kept = keep_freed_host_memory_if_asked()
import jax, jax.numpy as jnp

@jax.jit
def f(x):
  y = jax.lax.optimization_barrier(x * 2.0)   # a 64 MB temporary
  return jnp.sum(y * y[::-1])

x = jnp.ones((16 * 1024 * 1024,), jnp.float32)
values = [float(f(x)) for _ in range(32)]   # compile, then calls until the heap settles
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
values += [float(f(x)) for _ in range(16)]
faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 16
print(json.dumps({"kept": kept, "faults_per_call": faults, "values": values}))
"""

PAGES_OF_TEMPORARY = 64 * 1024 * 1024 // 4096


def run(keep: str | None) -> dict:
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env.pop("RLJAX_KEEP_FREED_MEMORY", None)
  if keep is not None:
    env["RLJAX_KEEP_FREED_MEMORY"] = keep
  proc = subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True,
                        text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr
  return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_kept_memory_is_not_faulted_in_again_and_results_are_unchanged():
  default = run(keep=None)
  kept = run(keep="1")
  assert default["kept"] is False and kept["kept"] is True
  assert run(keep="0")["kept"] is False
  # glibc's default: the temporary's pages are faulted in on every call
  assert default["faults_per_call"] > 0.9 * PAGES_OF_TEMPORARY, default
  # kept: the calls' blocks come from the heap and are reused. The heap keeps growing now
  # and then (a freed block split by small allocations no longer fits a whole temporary):
  # seen 0 to 2,048 faults per call over these 16 calls, against the default's 32,768
  assert kept["faults_per_call"] < default["faults_per_call"] / 4, (kept, default)
  assert kept["values"] == default["values"] == [2.0 * 2.0 * 16 * 1024 * 1024] * 48

