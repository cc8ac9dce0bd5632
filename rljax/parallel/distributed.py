"""Multi-process (multi-host) start-up."""

from __future__ import annotations

import os

import jax

_ENV_VARS = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")


def cluster_process_count() -> int:
  """Processes a cluster launcher started for this job (1 when not under one).

  SLURM (`srun`: SLURM_NTASKS), Open MPI (OMPI_COMM_WORLD_SIZE) and multi-host TPU VMs
  (TPU_WORKER_HOSTNAMES, one host per comma) are recognised; JAX's own cluster detection
  then finds the coordinator.
  """
  for var in ("SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"):
    if os.environ.get(var, "").isdigit():
      return int(os.environ[var])
  hosts = os.environ.get("TPU_WORKER_HOSTNAMES", "")
  return len([h for h in hosts.split(",") if h]) or 1


def initialize_distributed(coordinator_address: str | None = None,
                           num_processes: int | None = None,
                           process_id: int | None = None, **kwargs) -> bool:
  """Wraps `jax.distributed.initialize`; a no-op for a single process.

  Call before any other JAX call, in every process; a no-op if JAX is already initialised. Arguments default to the
  environment variables JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID;
  with none set, a job started by SLURM, MPI or on a multi-host TPU VM with more than one
  process is initialised by JAX's own cluster detection (`cluster_process_count`); with
  none of these, or with `num_processes == 1`, nothing is done.

  Args:
    coordinator_address: "host:port" of process 0.
    num_processes: total number of processes.
    process_id: this process's index in [0, num_processes).
    **kwargs: passed to `jax.distributed.initialize` (e.g. `local_device_ids`).
  Returns:
    True if `jax.distributed.initialize` was called.
  """
  if jax.distributed.is_initialized():   # e.g. by a launcher wrapper: calling again raises
    return False
  coordinator_address = coordinator_address or os.environ.get("JAX_COORDINATOR_ADDRESS")
  if num_processes is None and os.environ.get("JAX_NUM_PROCESSES"):
    num_processes = int(os.environ["JAX_NUM_PROCESSES"])
  if process_id is None and os.environ.get("JAX_PROCESS_ID"):
    process_id = int(os.environ["JAX_PROCESS_ID"])
  explicit = coordinator_address or num_processes is not None or process_id is not None or kwargs
  if not explicit and cluster_process_count() > 1:
    jax.distributed.initialize()   # JAX detects SLURM / MPI / TPU-pod processes itself
    return True
  if num_processes == 1 or not explicit:
    return False
  jax.distributed.initialize(coordinator_address=coordinator_address,
                             num_processes=num_processes, process_id=process_id, **kwargs)
  return True
