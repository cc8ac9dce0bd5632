"""No silent change of behaviour, on any x86 CPU with AVX2: short float64 runs reproduce the
metrics in `tests/golden_metrics_x64.json` within 1e-9 relative, six metrics the trainer
computes in float32 within 1e-4 (`tests/golden_runs.py` says how they are made and
re-recorded). Each run is a process of its own: JAX's 64-bit mode must be on before JAX
starts, and this session's JAX runs in 32-bit mode.

Checked: recorded with AVX-512 kernels, reproduced with `XLA_FLAGS=--xla_cpu_max_isa=AVX2`.
With AVX or SSE4.2 kernels only (no FMA) the first iteration's samples already differ: some
float32 step on the way (the warm start's or the sampler's) rounds differently without FMA,
so the test skips on a CPU without AVX2 rather than fail there."""

import json
import pathlib
import subprocess
import sys

import pytest
from golden_runs import X64_FLOAT32_METRICS, X64_PATH, X64_SPECS, compare, x64_environment

GOLDEN = json.loads(X64_PATH.read_text())
ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_x64_golden_file_covers_its_specs_in_float64():
  assert sorted(GOLDEN["runs"]) == sorted(X64_SPECS)
  assert GOLDEN["overrides"]["model.dtype"] == GOLDEN["overrides"]["model.param_dtype"] == "float64"
  for run in GOLDEN["runs"].values():
    assert len(run["metrics"]) == 3
    # the regime acts: rewards vary within groups, so the updates move the policy
    assert sum(r["train/advantage_abs_mean"] > 0 for r in run["metrics"]) >= 2


def run_x64(spec: str) -> dict:
  """The float64 run of `spec`, in a process of its own (`golden_runs.py --run-x64`)."""
  done = subprocess.run([sys.executable, str(ROOT / "tests" / "golden_runs.py"), "--run-x64",
                         spec], cwd=ROOT, env=x64_environment(), capture_output=True, text=True)
  lines = [line for line in done.stdout.splitlines() if line.startswith("RUN ")]
  assert done.returncode == 0 and lines, done.stderr[-3000:]
  return json.loads(lines[-1].removeprefix("RUN "))


def _has_avx2() -> bool:
  try:
    flags = pathlib.Path("/proc/cpuinfo").read_text()
  except OSError:
    return True   # not Linux: let the test say
  return "avx2" in flags.split()


@pytest.mark.slow
@pytest.mark.skipif(not _has_avx2(), reason="float64 golden runs are reproduced on AVX2 and "
                    "AVX-512 kernels; without FMA a float32 step rounds differently")
@pytest.mark.parametrize("spec", X64_SPECS)
def test_float64_run_reproduces_the_recorded_metrics_on_any_cpu(spec):
  # float64 rounding differs between CPUs by ~1e-16; 1e-9 leaves room for summation order.
  # The few metrics the trainer computes in float32 get 1e-4 (`X64_FLOAT32_METRICS`).
  differences = compare(GOLDEN["runs"][spec], run_x64(spec), rtol=1e-9,
                        loose=X64_FLOAT32_METRICS, loose_rtol=1e-4)
  assert not differences, "\n".join(differences[:20])
