"""Multi-process (multi-host) start-up."""

from __future__ import annotations

import os

import jax

_ENV_VARS = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")


def initialize_distributed(coordinator_address: str | None = None,
                           num_processes: int | None = None,
                           process_id: int | None = None, **kwargs) -> bool:
  """Wraps `jax.distributed.initialize`; a no-op for a single process.

  Call once, before any other JAX call, in every process. Arguments default to the
  environment variables JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID;
  with none set (and no cluster auto-detection requested through `kwargs`), or with
  `num_processes == 1`, nothing is done.

  Args:
    coordinator_address: "host:port" of process 0.
    num_processes: total number of processes.
    process_id: this process's index in [0, num_processes).
    **kwargs: passed to `jax.distributed.initialize` (e.g. `local_device_ids`).
  Returns:
    True if `jax.distributed.initialize` was called.
  """
  coordinator_address = coordinator_address or os.environ.get("JAX_COORDINATOR_ADDRESS")
  if num_processes is None and os.environ.get("JAX_NUM_PROCESSES"):
    num_processes = int(os.environ["JAX_NUM_PROCESSES"])
  if process_id is None and os.environ.get("JAX_PROCESS_ID"):
    process_id = int(os.environ["JAX_PROCESS_ID"])
  if num_processes == 1 or (coordinator_address is None and num_processes is None
                            and process_id is None and not kwargs):
    return False
  jax.distributed.initialize(coordinator_address=coordinator_address,
                             num_processes=num_processes, process_id=process_id, **kwargs)
  return True
