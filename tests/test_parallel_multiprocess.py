"""Two local JAX processes (2 CPU devices each) joined by `initialize_distributed`.

The sharded forward over the global 4-device mesh (fsdp=2 x tensor=2) must equal each
process's own unsharded forward, and both report the same replicated fraction. A mesh
over `select_devices(2)` (`parallel.num_devices=2`) takes one device of each process.
"""

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest
from tolerances import f32_atol

WORKER = textwrap.dedent("""
  import json, os, sys
  pid, n, port = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
  from rljax.parallel import (batch_sharding, initialize_distributed, make_mesh,
                              replicated_fraction, select_devices, shard_model)
  assert initialize_distributed(f"localhost:{port}", n, pid)
  import jax, jax.numpy as jnp, numpy as np
  from flax import nnx
  from jax.experimental import multihost_utils
  from rljax.models import Decoder
  from rljax.models.testing import perturb_params, tiny_config
  cfg = tiny_config(vocab_size=96)
  fwd = nnx.jit(lambda m, t: m(t, attention_mask=jnp.ones_like(t)))
  tokens = np.arange(4 * 6, dtype=np.int32).reshape(4, 6) % 96
  ref = np.asarray(fwd(perturb_params(Decoder(cfg, rngs=nnx.Rngs(0)), seed=1),
                       jnp.asarray(tokens)))
  mesh = make_mesh(data=1, fsdp=2, tensor=2)
  model = shard_model(perturb_params(Decoder(cfg, rngs=nnx.Rngs(0)), seed=1), mesh)
  glob = multihost_utils.host_local_array_to_global_array(
      tokens[pid * 2:(pid + 1) * 2], mesh, jax.sharding.PartitionSpec(("data", "fsdp")))
  out = multihost_utils.process_allgather(fwd(model, glob), tiled=True)
  # parallel.num_devices=2 of the 4: one device from each process, and the mesh runs.
  chosen = select_devices(2)
  half = make_mesh(data=-1, devices=chosen)
  rows = multihost_utils.host_local_array_to_global_array(
      np.full((1, 3), pid + 1.0, np.float32), half, jax.sharding.PartitionSpec("data"))
  total = float(jax.jit(jnp.sum)(rows))
  print("RESULT", json.dumps({"global": jax.device_count(), "repl": replicated_fraction(model),
                              "err": float(np.max(np.abs(np.asarray(out) - ref))),
                              "scale": float(np.max(np.abs(ref))),
                              "chosen": [d.process_index for d in chosen], "total": total}))
""")


def _free_port():
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


@pytest.mark.multiprocess
@pytest.mark.slow
def test_two_processes_sharded_forward_matches(tmp_path):
  script = tmp_path / "worker.py"
  script.write_text(WORKER)
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": root,
         "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
  port = str(_free_port())
  procs = [subprocess.Popen([sys.executable, str(script), str(i), "2", port], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for i in range(2)]
  results = []
  for p in procs:
    out, err = p.communicate(timeout=240)
    assert p.returncode == 0, err[-3000:]
    line = [x for x in out.splitlines() if x.startswith("RESULT ")][-1]
    results.append(json.loads(line[len("RESULT "):]))
  for r in results:
    assert r["global"] == 4
    assert r["err"] < f32_atol(r["scale"], ulps=256)   # sharded vs one device: other sums
    assert 0 < r["repl"] < 0.05
    assert r["chosen"] == [0, 1]   # not process 0's two devices
    assert r["total"] == 9.0       # 3 x 1 from process 0 + 3 x 2 from process 1
  assert results[0]["repl"] == results[1]["repl"]
