"""Running a script of benchmarks/ in a subprocess, as a user would, and reading its RESULT
lines (shared by tests/test_benchmarks_*.py). The subprocess inherits the test session's
persistent compilation cache (tests/conftest.py), not its 8 simulated CPU devices: the
scripts choose their own devices."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

BENCH = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"
DEVICE_FLAG = "--xla_force_host_platform_device_count"


def bench_env(**extra) -> dict:
  """The environment of a benchmark subprocess: the repository and benchmarks/ importable,
  XLA_FLAGS without the test session's simulated devices."""
  env = dict(os.environ, **extra)
  env["PYTHONPATH"] = os.pathsep.join(
      filter(None, [str(BENCH.parent), str(BENCH), os.environ.get("PYTHONPATH", "")]))
  env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split()
                              if not f.startswith(DEVICE_FLAG))
  return env


def run_bench(script: str, *args: str, python: str = sys.executable, timeout: int = 900,
              **env) -> dict:
  """Runs `benchmarks/<script> args...`; asserts exit status 0 and at least one RESULT
  line; returns {metric: RESULT dict} (the stdout under the key "_stdout")."""
  proc = subprocess.run([python, str(BENCH / script), *args], capture_output=True, text=True,
                        env=bench_env(**env), timeout=timeout, cwd=BENCH.parent)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  out = results(proc.stdout)
  assert out, f"{script}: no RESULT line\n" + proc.stdout[-3000:]
  out["_stdout"] = proc.stdout
  return out


def results(stdout: str) -> dict:
  """{metric: dict} of the `RESULT {...}` lines of a script's output."""
  rows = [json.loads(x[len("RESULT "):]) for x in stdout.splitlines() if x.startswith("RESULT ")]
  for r in rows:
    assert {"metric", "rljax", "peer", "ratio"} <= set(r), r
  return {r["metric"]: r for r in rows}
