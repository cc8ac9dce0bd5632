"""Short runs whose metrics are recorded in `tests/golden_metrics.json`: the guard against a
silent change of behaviour (a restructuring must reproduce them; an intentional change of a
default or of a key derivation re-records them in the same commit, and says why).

    python tests/golden_runs.py --record      # re-record on this machine
    python tests/golden_runs.py --record-x64  # re-record the float64 runs (any CPU)

Each run: the micro trainer of `train_micro.py`, 3 RL iterations after a 200-step SFT start on
2-term sums, at a 10x learning rate (so rewards vary within groups and clipping acts), on one of
the test session's 8 simulated devices.
The values are this CPU's floats: `cpu_fingerprint()` is stored with them, and on another
CPU (another instruction set, another matmul kernel) the comparison is skipped, not failed.

The float64 variant (`X64_SPECS`, `tests/golden_metrics_x64.json`, compared within 1e-9
relative by `tests/test_train_golden_x64.py` on any CPU; the few metrics computed in float32,
`X64_FLOAT32_METRICS`, within 1e-4) runs the same short runs with
JAX's 64-bit mode on and the policy in float64 (`model.dtype`, `model.param_dtype`), in a
process of its own (the mode must be set before JAX starts): CPUs round float64 sums
differently by about 1e-16, far inside 1e-9.
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
X64_PATH = GOLDEN_PATH.with_name("golden_metrics_x64.json")
# the float64 runs: two specs keep the guard's cost to two short runs (each compiles the
# trainer's programs; minutes on a loaded 2-core host). Left out: every spec whose run has a
# float32 or bfloat16 part by design (none of these); `calculator` as in the float32 file.
X64_SPECS = ("grpo", "ppo")
X64_OVERRIDES = {"model.dtype": "float64", "model.param_dtype": "float64"}
# metrics the trainer computes in float32 whatever the model's dtype (the update batch's
# advantages, the rollout's entropies, the ratio and entropy of the update's float32 loss
# terms): between instruction sets they differ by ~1e-8 to 6e-7 relative (grpo recorded
# with AVX-512 and re-run with XLA_FLAGS=--xla_cpu_max_isa=AVX2: 15 of 172 values), so they
# are compared within 1e-4 (a covariance cancels: 8.7e-6 apart with AVX2 kernels); every
# other value within 1e-9
X64_FLOAT32_METRICS = ("train/advantage_abs_mean", "tokens/cov_logp_adv",
                       "train/entropy_rollout", "update/ratio", "update/entropy",
                       "critic/explained_variance")


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


def run_spec(spec: str, tmp_dir: pathlib.Path, *, x64: bool = False) -> dict:
  """{"metrics": [record per iteration], "result": RESULT dict} of one short run (`x64`:
  in float64, in a process started by `x64_environment`)."""
  sys.path.insert(0, str(pathlib.Path(__file__).parent))
  from train_micro import micro_config, read_records

  from rljax.train.loop import train

  extra = {} if spec.startswith("user_task") else SIGNAL
  if x64:
    import jax
    if not jax.config.jax_enable_x64:
      raise RuntimeError("the float64 golden runs need JAX_ENABLE_X64=1 before JAX starts")
    same_index_dtypes()
    extra = dict(extra, **X64_OVERRIDES)
  config = micro_config(spec, tmp_dir, **OVERRIDES, **extra)
  result = train(config)
  records = read_records(tmp_dir / spec.replace(":", "_"))
  return {"metrics": [_clean(r) for r in records], "result": _clean(result)}


def same_index_dtypes():
  """`jax.lax.dynamic_slice` / `dynamic_update_slice` with their Python-int start indices cast
  to the dtype of the traced ones. Under 64-bit mode a literal 0 is int64 beside the code's
  int32 positions, which these two refuse to mix; only the indices' dtype changes, no value.
  """
  import functools

  import jax
  import jax.numpy as jnp

  def same(indices):
    indices = tuple(indices)
    traced = [jnp.asarray(i).dtype for i in indices if not isinstance(i, int)]
    if not traced:
      return indices
    return tuple(jnp.asarray(i, traced[0]) for i in indices)

  def patch(name, position):
    original = getattr(jax.lax, name)
    if getattr(original, "same_index_dtypes", False):
      return

    @functools.wraps(original)
    def wrapped(*args, **kwargs):
      args = list(args)
      args[position] = same(args[position])
      return original(*args, **kwargs)
    wrapped.same_index_dtypes = True
    setattr(jax.lax, name, wrapped)
  patch("dynamic_slice", 1)
  patch("dynamic_update_slice", 2)


def x64_environment() -> dict:
  """os.environ for a process that runs the float64 golden runs (8 simulated CPU devices,
  as the test session; 64-bit mode on before JAX starts)."""
  import os
  env = dict(os.environ, JAX_ENABLE_X64="1", JAX_PLATFORMS="cpu")
  flags = env.get("XLA_FLAGS", "")
  if "--xla_force_host_platform_device_count" not in flags:
    env["XLA_FLAGS"] = (flags + " --xla_force_host_platform_device_count=8").strip()
  return env


def compare(expected, actual, *, rtol: float, path: str = "", loose=(),
            loose_rtol: float = 1e-6) -> list[str]:
  """Differences between two recorded trees: missing/extra keys, or numbers further apart
  than `rtol` relative (0: bitwise); keys named in `loose` within `loose_rtol`."""
  if isinstance(expected, dict) and isinstance(actual, dict):
    out = [f"{path}.{k}: missing" for k in expected if k not in actual]
    out += [f"{path}.{k}: new key" for k in actual if k not in expected]
    for k in expected.keys() & actual.keys():
      out += compare(expected[k], actual[k], rtol=loose_rtol if k in loose else rtol,
                     path=f"{path}.{k}", loose=loose, loose_rtol=loose_rtol)
    return out
  if isinstance(expected, list) and isinstance(actual, list):
    if len(expected) != len(actual):
      return [f"{path}: length {len(actual)} != {len(expected)}"]
    return [d for i, (e, a) in enumerate(zip(expected, actual))
            for d in compare(e, a, rtol=rtol, path=f"{path}[{i}]", loose=loose,
                             loose_rtol=loose_rtol)]
  if isinstance(expected, (int, float)) and isinstance(actual, (int, float)):
    if math.isnan(expected) and math.isnan(actual):
      return []
    if abs(actual - expected) <= rtol * max(abs(expected), abs(actual)):
      return []
    return [f"{path}: {actual!r} != {expected!r}"]
  return [] if expected == actual else [f"{path}: {actual!r} != {expected!r}"]


def main(argv):
  import tempfile
  usage = ("usage: python tests/golden_runs.py --record | --record-x64 | "
           "--run-x64 SPEC (prints the run's JSON)")
  if not argv or argv[0] not in ("--record", "--record-x64", "--run-x64"):
    raise SystemExit(usage)
  x64 = argv[0] != "--record"
  if argv[0] == "--run-x64":
    with tempfile.TemporaryDirectory() as tmp:
      print("RUN " + json.dumps(run_spec(argv[1], pathlib.Path(tmp), x64=True)), flush=True)
    return
  out = {"cpu": cpu_fingerprint(), "overrides": dict(OVERRIDES, **X64_OVERRIDES) if x64
         else OVERRIDES, "runs": {}}
  with tempfile.TemporaryDirectory() as tmp:
    for spec in X64_SPECS if x64 else SPECS:
      out["runs"][spec] = run_spec(spec, pathlib.Path(tmp), x64=x64)
      print(f"recorded {spec}", flush=True)
  (X64_PATH if x64 else GOLDEN_PATH).write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
  import os
  # the test session's environment (tests/conftest.py): XLA's CPU client with 8 devices
  # splits its thread pool differently, so floats recorded with one device would not match
  if sys.argv[1:2] in (["--record-x64"], ["--run-x64"]):
    os.environ.update(x64_environment())
  else:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=8").strip()
  main(sys.argv[1:])
