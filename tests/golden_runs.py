"""Short runs whose metrics are recorded in `tests/golden_metrics.json`: the guard against a
silent change of behaviour (a restructuring must reproduce them; an intentional change of a
default or of a key derivation re-records them in the same commit, and says why).

    python tests/golden_runs.py --record      # re-record on this machine

Each run: the micro trainer of `train_micro.py`, 3 RL iterations after a 200-step SFT start on
2-term sums, at a 10x learning rate (so rewards vary within groups and clipping acts), on one of
the test session's 8 simulated devices.
The values are this CPU's floats: `cpu_fingerprint()` is stored with them, and on another
CPU (another instruction set, another matmul kernel) the comparison is skipped, not failed.
"""

from __future__ import annotations

import hashlib
import json
import math
import pathlib
import platform
import sys

GOLDEN_PATH = pathlib.Path(__file__).with_name("golden_metrics.json")
SPECS = ("grpo", "ppo", "dapo:dynamic_sampling", "gspo", "calculator", "lora:r8", "user_task")
OVERRIDES = {"run.iterations": 3, "sft.steps": 200, "sft.worked_steps": 150, "sft.lr": 1e-2,
             "sft.cache_dir": "", "task.difficulty_max": 1, "optim.actor_lr": 1e-3,
             "parallel.num_devices": 1, "algo.dynamic_sampling_max_rounds": 8}
# A reward that varies with the text, added to the task's, so every run's groups have signal
# (the task whose own config names reward functions keeps them).
SIGNAL = {"task.reward_fns": ["tests/signal_rewards.py:digit_share"],
          "task.reward_fns_mode": "add"}
# Keys that measure the machine rather than the computation.
VOLATILE_PREFIXES = ("time/", "env/seconds", "compile/")
VOLATILE_KEYS = ("wall_s",)


def cpu_fingerprint() -> str:
  """The CPU model and the vector-ISA flags XLA's CPU kernels depend on, hashed."""
  model, flags = platform.processor(), ""
  try:
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
      if line.startswith("model name") and not model:
        model = line.split(":", 1)[1].strip()
      if line.startswith("flags"):
        flags = " ".join(sorted(f for f in line.split(":", 1)[1].split()
                                if f.startswith(("avx", "fma", "sse", "amx"))))
        break
  except OSError:
    pass
  import jax
  return hashlib.sha256(f"{model}|{flags}|{jax.__version__}".encode()).hexdigest()[:16]


def _clean(record: dict) -> dict:
  return {k: v for k, v in record.items()
          if not k.startswith(VOLATILE_PREFIXES) and k not in VOLATILE_KEYS}


def run_spec(spec: str, tmp_dir: pathlib.Path) -> dict:
  """{"metrics": [record per iteration], "result": RESULT dict} of one short run."""
  sys.path.insert(0, str(pathlib.Path(__file__).parent))
  from train_micro import micro_config, read_records

  from rljax.train.loop import train

  extra = {} if spec.startswith("user_task") else SIGNAL
  config = micro_config(spec, tmp_dir, **OVERRIDES, **extra)
  result = train(config)
  records = read_records(tmp_dir / spec.replace(":", "_"))
  return {"metrics": [_clean(r) for r in records], "result": _clean(result)}


def compare(expected, actual, *, rtol: float, path: str = "") -> list[str]:
  """Differences between two recorded trees: missing/extra keys, or numbers further apart
  than `rtol` relative (0: bitwise)."""
  if isinstance(expected, dict) and isinstance(actual, dict):
    out = [f"{path}.{k}: missing" for k in expected if k not in actual]
    out += [f"{path}.{k}: new key" for k in actual if k not in expected]
    for k in expected.keys() & actual.keys():
      out += compare(expected[k], actual[k], rtol=rtol, path=f"{path}.{k}")
    return out
  if isinstance(expected, list) and isinstance(actual, list):
    if len(expected) != len(actual):
      return [f"{path}: length {len(actual)} != {len(expected)}"]
    return [d for i, (e, a) in enumerate(zip(expected, actual))
            for d in compare(e, a, rtol=rtol, path=f"{path}[{i}]")]
  if isinstance(expected, (int, float)) and isinstance(actual, (int, float)):
    if math.isnan(expected) and math.isnan(actual):
      return []
    if abs(actual - expected) <= rtol * max(abs(expected), abs(actual)):
      return []
    return [f"{path}: {actual!r} != {expected!r}"]
  return [] if expected == actual else [f"{path}: {actual!r} != {expected!r}"]


def main(argv):
  import tempfile
  if "--record" not in argv:
    raise SystemExit("usage: python tests/golden_runs.py --record")
  out = {"cpu": cpu_fingerprint(), "overrides": OVERRIDES, "runs": {}}
  with tempfile.TemporaryDirectory() as tmp:
    for spec in SPECS:
      out["runs"][spec] = run_spec(spec, pathlib.Path(tmp))
      print(f"recorded {spec}", flush=True)
  GOLDEN_PATH.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
  import os
  # the test session's environment (tests/conftest.py): XLA's CPU client with 8 devices
  # splits its thread pool differently, so floats recorded with one device would not match
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                             + " --xla_force_host_platform_device_count=8").strip()
  main(sys.argv[1:])
