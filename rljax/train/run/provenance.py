"""Where a run's numbers come from: the rljax commit, the JAX version and the CPU, written
beside every run (`provenance.json`) so a report built from the runs later can name them."""

from __future__ import annotations

import json
import os
import pathlib
import platform
import subprocess

import jax

FILE = "provenance.json"
_PACKAGE = pathlib.Path(__file__).resolve().parents[2]   # the rljax package directory


def _git(*args) -> str:
  try:
    out = subprocess.run(["git", "-C", str(_PACKAGE), *args], capture_output=True, text=True,
                         timeout=10, check=True)
  except (OSError, subprocess.SubprocessError):
    return ""
  return out.stdout.strip()


def commit() -> str:
  """The rljax checkout's commit hash, "+dirty" when tracked files have uncommitted changes,
  or "unknown" outside a git checkout."""
  head = _git("rev-parse", "HEAD")
  if not head:
    return "unknown"
  return head + ("+dirty" if _git("status", "--porcelain", "--untracked-files=no") else "")


def cpu() -> str:
  """The CPU model name and the number of cores this process may use."""
  name = platform.processor() or platform.machine()
  try:
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
      if line.startswith("model name"):
        name = line.split(":", 1)[1].strip()
        break
  except OSError:
    pass
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  return f"{name}, {cores} cores"


def provenance() -> dict:
  """{"commit", "jax", "cpu"} of this process."""
  return {"commit": commit(), "jax": jax.__version__, "cpu": cpu()}


def write(run_dir) -> None:
  """Writes `provenance.json` in `run_dir`."""
  (pathlib.Path(run_dir) / FILE).write_text(json.dumps(provenance(), indent=2))


def read(run_dir) -> dict:
  """The run's `provenance.json` ({} for a run written before it existed)."""
  path = pathlib.Path(run_dir) / FILE
  return json.loads(path.read_text()) if path.is_file() else {}
