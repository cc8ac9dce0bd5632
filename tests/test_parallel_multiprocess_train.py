"""The trainer under `jax.distributed`: 2 local processes x 4 CPU devices = one global mesh
of 8 give the same run as one process with 8 devices.

Each process tokenizes, samples and scores only the rollout rows on its own devices, so
equality also checks that the rows are split and gathered back in the right order. Only
process 0 writes metrics and results; the orbax checkpoint is written by both processes
together and restored here by a single process, as a resumed run would.
"""

import json
import os
import pathlib
import socket
import subprocess
import sys
import zlib

import jax
import numpy as np
import pytest
from tolerances import f32_atol
from train_micro import MICRO, micro_config, read_records

from rljax.data import tasks
from rljax.train.loop import train
from rljax.train.params import Checkpointer
from rljax.train.run.build import build

REPO = pathlib.Path(__file__).parent.parent
# Exactly equal in practice (same programs on the same mesh); the tolerance is that of
# the 1-vs-8-device test (fp32 sums reduced in another order).
RTOL = 2e-5


def _free_port():
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def varied_score(self, prompt, completion):
  """A reward that varies within groups (an untrained model never solves the task, and
  all-zero rewards would make every loss 0): a hash of the prompt and completion."""
  del self
  accuracy = float(zlib.crc32(f"{prompt.id}|{completion}".encode()) % 3 == 0)
  return tasks.RewardBreakdown(total=accuracy, accuracy=accuracy, format=0.0)


WORKER = f"""
import sys
import zlib
sys.path.insert(0, {str(pathlib.Path(__file__).parent)!r})
from test_parallel_multiprocess_train import varied_score
from rljax.data import tasks
from rljax.cli import main
tasks.Task.score = varied_score
main(sys.argv[1:])
"""


def _launch(spec, run_dir, logs):
  """`rljax train` (the CLI) twice, joined through the CLI's JAX_* environment variables."""
  flags = [f"--config.{k}={v}" for k, v in dict(MICRO, **{"run.dir": str(run_dir)}).items()]
  xla = " ".join(f for f in os.environ.get("XLA_FLAGS", "").split()
                 if "device_count" not in f)
  env = dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu",
             XLA_FLAGS=f"{xla} --xla_force_host_platform_device_count=4".strip(),
             JAX_COORDINATOR_ADDRESS=f"localhost:{_free_port()}", JAX_NUM_PROCESSES="2")
  procs = []
  for i in range(2):
    out = open(logs / f"process{i}.log", "w")   # noqa: SIM115 - closed after the wait
    procs.append((subprocess.Popen(
        [sys.executable, "-c", WORKER, "train", "--config", f"experiments/{spec}.py", *flags],
        cwd=REPO, env=dict(env, JAX_PROCESS_ID=str(i)), stdout=out, stderr=subprocess.STDOUT),
        out))
  return procs


def _wait(procs, logs, timeout=600):
  results = []
  try:
    for i, (proc, out) in enumerate(procs):
      proc.wait(timeout=timeout)
      out.close()
      log = (logs / f"process{i}.log").read_text()
      assert proc.returncode == 0, log[-3000:]
      results.append(json.loads([x for x in log.splitlines() if x.startswith("RESULT ")][-1][7:]))
  finally:
    for proc, _ in procs:
      if proc.poll() is None:
        proc.kill()
  return results


def _restore(config):
  """What a resumed run starts from: the newest checkpoint, restored (as `train` does) into
  a fresh state with this process's shardings."""
  run = build(config)
  template = run.params.init_state(run.params.initial_actor)
  ckpt = Checkpointer(config.run.dir)
  try:
    step, state, host = run.params.restore(ckpt, template)
  finally:
    ckpt.close()
  return step, jax.tree.map(np.asarray, state), host


@pytest.mark.multiprocess
@pytest.mark.parametrize("spec", [
    "grpo",
    # DAPO's dynamic sampling gathers each round's rows onto every host and picks groups
    # there; the update batch then goes back onto the mesh from identical host copies.
    pytest.param("dapo", marks=pytest.mark.slow)])
def test_two_processes_train_like_one_process_with_eight_devices(spec, tmp_path, monkeypatch):
  monkeypatch.setattr(tasks.Task, "score", varied_score)
  multi = tmp_path / "multi" / spec
  procs = _launch(spec, multi, tmp_path)
  # The single-process reference runs here (8 devices, conftest) while the 2 processes run.
  assert jax.process_count() == 1 and jax.device_count() == 8
  single_result = train(micro_config(spec, tmp_path / "single"))
  results = _wait(procs, tmp_path)

  # Both processes finish the same run, with the held-out results of the single process.
  same = lambda r: {k: v for k, v in r.items() if k != "wall_s"}  # noqa: E731
  assert same(results[0]) == same(results[1]) == same(single_result)
  one, two = read_records(tmp_path / "single" / spec), read_records(multi)
  assert [r["iteration"] for r in two] == [1, 2]   # process 0 alone wrote the records
  for a, b in zip(one, two):
    keys = {k for k in a if not k.startswith("time/") and k != "compile/programs"}
    assert keys == {k for k in b if not k.startswith("time/") and k != "compile/programs"}
    for key in ("train/raw_score", "train/accuracy", "train/response_length_mean"):
      assert a[key] == b[key], key
    assert a["update/grad_norm"] > 0 and 0 < a["train/accuracy"] < 1   # a real update
    for key in sorted(keys):   # non-finite values are written as strings ("nan")
      if isinstance(a[key], str) or isinstance(b[key], str):
        assert a[key] == b[key], key
      else:
        # means of O(1) terms near 0 (loss, log-prob gap) keep the terms' rounding
        np.testing.assert_allclose(b[key], a[key], rtol=RTOL, atol=f32_atol(1.0, ulps=64),
                                   err_msg=key)
  assert json.loads((multi / "result.json").read_text())["iterations"] == 2

  # The checkpoint both processes wrote together resumes in one process, equal to the
  # single-process run's own.
  assert sorted(p.name for p in (multi / "checkpoints").iterdir()) == ["2"]
  (step_a, a, host_a), (step_b, b, host_b) = (
      _restore(micro_config(spec, tmp_path / name)) for name in ("single", "multi"))
  assert step_a == step_b == 2 and host_a == host_b
  jax.tree.map(lambda x, y: np.testing.assert_allclose(y, x, rtol=RTOL, atol=1e-7), a, b)


@pytest.mark.multiprocess
def test_two_processes_with_num_devices_take_half_of_each(tmp_path, monkeypatch):
  """`parallel.num_devices=4` over 2 processes x 4 devices: two devices of each process
  (`parallel.select_devices`; a prefix of the global list would leave process 1 without
  any). The run finishes in both processes as one process with 4 devices does."""
  monkeypatch.setattr(tasks.Task, "score", varied_score)
  four = {"parallel.num_devices": 4}
  monkeypatch.setattr(sys.modules[__name__], "MICRO", dict(MICRO, **four))
  procs = _launch("grpo", tmp_path / "multi" / "grpo", tmp_path)
  single_result = train(micro_config("grpo", tmp_path / "single", **four))
  results = _wait(procs, tmp_path)
  same = lambda r: {k: v for k, v in r.items() if k != "wall_s"}  # noqa: E731
  assert same(results[0]) == same(results[1]) == same(single_result)


@pytest.mark.multiprocess
def test_two_processes_with_the_sampler_on_its_own_devices(tmp_path, monkeypatch):
  """2 processes x 4 devices, 2 of each process's devices sampling and 2 training
  (`parallel.sampler_devices=4`, weights resharded to the sampler through host memory after
  every update): the run finishes in both processes as one process with 8 devices does."""
  monkeypatch.setattr(tasks.Task, "score", varied_score)
  split = {"parallel.sampler_devices": 4}
  monkeypatch.setattr(sys.modules[__name__], "MICRO", dict(MICRO, **split))
  procs = _launch("grpo", tmp_path / "multi" / "grpo", tmp_path)
  single_result = train(micro_config("grpo", tmp_path / "single", **split))
  results = _wait(procs, tmp_path)
  same = lambda r: {k: v for k, v in r.items() if k != "wall_s"}  # noqa: E731
  assert same(results[0]) == same(results[1]) == same(single_result)
  records = read_records(tmp_path / "multi" / "grpo")
  assert all(r["sync/bytes"] > 0 for r in records)
