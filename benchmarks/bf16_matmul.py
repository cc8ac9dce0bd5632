"""Is bf16 (with fp32 accumulation) faster than fp32 for the matmuls rljax runs on this CPU?

Times `jnp.dot(a, b, preferred_element_type=float32)` with bf16 inputs against the same
dot in fp32, under jit, at the shapes that dominate Qwen2.5-0.5B's decode and update
(rows x width @ width x out) and at 1024³; and `torch.matmul` the same way in its own
worker process (oneDNN's bf16 path), for comparison. Prints the CPU's bf16 features
(`avx512_bf16`, `amx_bf16` in /proc/cpuinfo), GFLOP/s per shape and dtype, and the
speed-up of bf16 over fp32.

    python benchmarks/bf16_matmul.py [--reps 20]
    python benchmarks/bf16_matmul.py --reduced   # seconds: CI's run (measures nothing)

`--reduced`: `REDUCED_SHAPES` (a decode, an update and a 256³ product), --reps 3.

Last line: RESULT {"metric": "bf16_speedup_1024", "rljax": <jax bf16 / fp32 speed>, "peer":
<torch bf16 / fp32 speed>, "ratio": null, "shapes": {...}}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from workload import sig

# (name, M, K, N): decode rows x width into the fused gate|up and q|k|v, the down
# projection, the update's MLP over 8 x 192 tokens, the lm head chunk, and the cube
SHAPES = (
    ("decode b8 gate|up", 8, 896, 9728),
    ("decode b64 gate|up", 64, 896, 9728),
    ("decode b8 q|k|v", 8, 896, 1152),
    ("update MLP up (1536 rows)", 1536, 896, 4864),
    ("update MLP down (1536 rows)", 1536, 4864, 896),
    ("lm head chunk (1024 rows)", 1024, 896, 151936),
    ("cube 1024", 1024, 1024, 1024),
)
REDUCED_SHAPES = (
    ("decode b8 (reduced)", 8, 32, 128),
    ("update (reduced)", 64, 32, 64),
    ("cube 256", 256, 256, 256),
)


def cpu_flags() -> list[str]:
  with open("/proc/cpuinfo") as f:
    flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
  return sorted(x for x in flags if "bf16" in x or x.startswith("amx") or x == "avx512f")


def median_seconds(fn, reps: int, budget_s: float = 2.0) -> float:
  """Median of up to `reps` timed calls after 2 untimed ones; fewer (at least 3) when the
  calls are slow, so one measurement takes about `budget_s`."""
  fn()
  t0 = time.perf_counter()
  fn()
  reps = max(3, min(reps, int(budget_s / max(time.perf_counter() - t0, 1e-6))))
  times = []
  for _ in range(reps):
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
  return statistics.median(times)


def jax_rates(reps: int, shapes=SHAPES) -> dict:
  import jax
  import jax.numpy as jnp

  out = {}
  for name, m, k, n in shapes:
    a = jax.random.normal(jax.random.key(0), (m, k), jnp.float32)
    b = jax.random.normal(jax.random.key(1), (k, n), jnp.float32)
    row = {}
    for dt in ("float32", "bfloat16"):
      x, y = a.astype(dt), b.astype(dt)
      dot = jax.jit(lambda x, y: jnp.dot(x, y, preferred_element_type=jnp.float32))
      s = median_seconds(lambda: dot(x, y).block_until_ready(), reps)  # noqa: B023
      row[dt] = 2 * m * k * n / s / 1e9
    out[name] = row
  return out


def torch_rates(reps: int, shapes=SHAPES) -> dict:
  import torch

  out = {}
  for name, m, k, n in shapes:
    a, b = torch.randn(m, k), torch.randn(k, n)
    row = {}
    for dt in (torch.float32, torch.bfloat16):
      x, y = a.to(dt), b.to(dt)
      with torch.inference_mode():
        s = median_seconds(lambda: torch.matmul(x, y), reps)  # noqa: B023
      row[str(dt).split(".")[1]] = 2 * m * k * n / s / 1e9
    out[name] = row
  return out


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--reps", type=int, default=20)
  parser.add_argument("--reduced", action="store_true",
                      help="seconds: `REDUCED_SHAPES`, --reps 3 (CI's run; measures nothing)")
  parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
  args = parser.parse_args()
  shapes = REDUCED_SHAPES if args.reduced else SHAPES
  if args.worker:
    print("WORKER " + json.dumps(torch_rates(args.reps, shapes)))
    return
  if args.reduced:
    args.reps = 3
  load = os.getloadavg()[0]
  flags = cpu_flags()
  print(f"CPU flags: {' '.join(flags)}; load average {load:.2f}", flush=True)
  jx = jax_rates(args.reps, shapes)
  proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", "--reps",
                         str(args.reps)] + ["--reduced"] * args.reduced,
                        capture_output=True, text=True)
  lines = [x for x in proc.stdout.splitlines() if x.startswith("WORKER ")]
  th = json.loads(lines[-1][7:]) if lines else {}
  print("\n| shape (M x K x N) | JAX fp32 | JAX bf16 | bf16/fp32 | torch fp32 | torch bf16 "
        "| bf16/fp32 |\n|---|---:|---:|---:|---:|---:|---:|")
  for name, m, k, n in shapes:
    j, t = jx[name], th.get(name, {"float32": float("nan"), "bfloat16": float("nan")})
    print(f"| {name} ({m} x {k} x {n}) | {j['float32']:.0f} | {j['bfloat16']:.0f} | "
          f"{j['bfloat16'] / j['float32']:.2f}x | {t['float32']:.0f} | {t['bfloat16']:.0f} | "
          f"{t['bfloat16'] / t['float32']:.2f}x |")
  print("(GFLOP/s, medians)")
  cube = shapes[-1][0]   # the last shape: the cube
  res = {"metric": "bf16_speedup_1024",
         "rljax": sig(jx[cube]["bfloat16"] / jx[cube]["float32"]),
         "peer": sig(th[cube]["bfloat16"] / th[cube]["float32"]) if th else None,
         "ratio": None, "cpu_flags": flags, "cube": cube, "reps": args.reps,
         "reduced": args.reduced,
         "shapes": {name: {"mkn": [m, k, n], "jax": {d: sig(v) for d, v in jx[name].items()},
                           "torch": {d: sig(v) for d, v in th.get(name, {}).items()}}
                    for name, m, k, n in shapes},
         "loadavg_before_after": [round(load, 2), round(os.getloadavg()[0], 2)]}
  print("RESULT " + json.dumps(res))


if __name__ == "__main__":
  main()
