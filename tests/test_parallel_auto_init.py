"""`initialize_distributed()` starts JAX's multi-process runtime only under a multi-process launcher."""

import jax
import pytest

from rljax.parallel import distributed


@pytest.mark.parametrize("env,count", [
    ({}, 1), ({"SLURM_NTASKS": "1"}, 1), ({"SLURM_NTASKS": "4"}, 4),
    ({"OMPI_COMM_WORLD_SIZE": "2"}, 2), ({"TPU_WORKER_HOSTNAMES": "w0,w1,w2,w3"}, 4),
    ({"TPU_WORKER_HOSTNAMES": "localhost"}, 1),
])
def test_cluster_process_count(env, count, monkeypatch):
  for var in ("SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "TPU_WORKER_HOSTNAMES", "JAX_NUM_PROCESSES",
              "JAX_COORDINATOR_ADDRESS", "JAX_PROCESS_ID"):
    monkeypatch.delenv(var, raising=False)
  for k, v in env.items():
    monkeypatch.setenv(k, v)
  calls = []
  monkeypatch.setattr(jax.distributed, "initialize", lambda *a, **k: calls.append((a, k)))
  assert distributed.cluster_process_count() == count
  assert distributed.initialize_distributed() == (count > 1)
  assert calls == ([((), {})] if count > 1 else [])


def test_already_initialised_is_left_alone(monkeypatch):
  """A launcher that called jax.distributed.initialize() itself: a second call would raise."""
  monkeypatch.setenv("SLURM_NTASKS", "4")
  calls = []
  monkeypatch.setattr(jax.distributed, "initialize", lambda *a, **k: calls.append((a, k)))
  monkeypatch.setattr(jax.distributed, "is_initialized", lambda: True)
  assert distributed.initialize_distributed() is False
  assert distributed.initialize_distributed("localhost:1234", 2, 0) is False
  assert calls == []
