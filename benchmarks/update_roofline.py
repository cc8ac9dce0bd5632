"""Update-step FLOP utilisation against the machine's measured matmul roofline.

Roofline: median GFLOP/s of a 1024³ fp32 `jnp.dot`. Update step: the trainer's jitted
`update_step` (`rljax.train.update.build_update_step`: forward + backward + AdamW, one
micro-batch) on the shared GRPO workload of benchmarks/README.md (tiny Qwen2, 64
sequences of 32 prompt + 96 completion tokens, lm head only on the completion
positions). FLOPs are analytic: 2·M·K·N per matmul (attention scores and values over
the full S×S square included), x3 for forward + backward = 172.3 GFLOP; the forward
alone (the old-log-prob pass, `objective.policy_forward`) is a third of that.

Each timed call is paired with a roofline measurement taken just before it. The headline
fraction is (median achieved GFLOP/s) / (median roofline GFLOP/s over all those
measurements); `paired_fraction` (median of the per-pair fractions) is also reported but
reads high when the load spikes during a short roofline sample. Every XLA flag set runs in its own subprocess (XLA reads XLA_FLAGS once, at start-up),
so the flags can be compared on the same script; a flag this XLA does not know is
reported as unsupported.

    python benchmarks/update_roofline.py [--reps 5] [--rounds 1] [--flags all|baseline,...]
    python benchmarks/update_roofline.py --reduced   # seconds: CI's run (measures nothing)

`--reduced`: `workload.REDUCED_HF_CONFIG` and `workload.REDUCED`'s rows (4 x (8 + 8)
tokens), a 256³ roofline, --reps 1, the baseline flags only.

Last line: RESULT {"metric": "update_flop_utilisation", "rljax": <fraction of the
roofline, baseline flags>, "peer": <roofline GFLOP/s>, "ratio": <fraction / 0.70 target>, ...}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np
from workload import sig

TARGET = 0.70
FLAG_SETS = {
    "baseline": "",
    "no_multi_thread_eigen": "--xla_cpu_multi_thread_eigen=false",
    "fast_math": "--xla_cpu_enable_fast_math=true",
    "onednn": "--xla_cpu_use_onednn=true",
    "xnnpack": "--xla_cpu_use_xnnpack=true",
    "concurrency_scheduler": "--xla_cpu_enable_concurrency_optimized_scheduler=true",
}


def train_flops(cfg, batch: int, prompt_len: int, new_tokens: int) -> float:
  """Analytic FLOPs of fwd+bwd over [batch, prompt_len + new_tokens], lm head on completions."""
  d, f, layers = cfg.hidden_size, cfg.intermediate_size, cfg.num_layers
  h, k, dh, v = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.vocab_size
  s = prompt_len + new_tokens
  dense = 2.0 * layers * (d * h * dh + 2 * d * k * dh + h * dh * d + 3 * d * f) * s
  attention = layers * 2 * (2.0 * s * s * h * dh)      # scores + weighted values
  head = 2.0 * d * v * new_tokens
  return 3 * batch * (dense + attention + head)


def median_time(fn, reps: int) -> tuple[float, list[float]]:
  times = []
  for _ in range(reps):
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
  return statistics.median(times), times


def worker(reps: int, reduced: bool = False) -> dict:
  """Runs in the subprocess: roofline, forward, grad-only and full update step timings."""
  import jax
  import jax.numpy as jnp
  from flax import nnx
  from workload import (
    GROUP,
    NEW_TOKENS,
    PROMPT_LEN,
    PROMPTS,
    REDUCED,
    REDUCED_ROOFLINE,
    RljaxGRPO,
    build_hf,
    load_into_rljax,
    trainer_modules,
  )

  objective = trainer_modules().objective
  shape = REDUCED if reduced else dict(prompts=PROMPTS, group=GROUP, prompt_len=PROMPT_LEN,
                                       new_tokens=NEW_TOKENS)
  p_len, t_len = shape["prompt_len"], shape["new_tokens"]
  n = REDUCED_ROOFLINE["n"] if reduced else 1024
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
  b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
  dot = jax.jit(jnp.dot)
  median_time(lambda: dot(a, b).block_until_ready(), 10)
  t_dot, _ = median_time(lambda: dot(a, b).block_until_ready(), 3 * reps)
  roofline = 2 * n ** 3 / t_dot / 1e9

  model, cfg = load_into_rljax(build_hf(reduced=reduced))
  grpo = RljaxGRPO(model, group=shape["group"], new_tokens=t_len)
  rng = np.random.default_rng(0)
  rows_n = shape["prompts"] * shape["group"]
  rows = {"prompt_tokens": rng.integers(2, cfg.vocab_size, (rows_n, p_len)),
          "prompt_mask": np.ones((rows_n, p_len), np.int32),
          "tokens": rng.integers(2, cfg.vocab_size, (rows_n, t_len)),
          "mask": np.ones((rows_n, t_len), np.int32)}
  seq, mb = grpo.minibatch(rows, 0)
  old_logp, _ = grpo.fns.policy_stats(grpo.state.actor, seq)
  mb["old_logp"] = mb["ref_logp"] = old_logp
  graphdef = nnx.graphdef(grpo.merge())

  @jax.jit
  def grad_only(params, batch):
    def loss(p):
      logp, _ = objective.policy_forward(nnx.merge(graphdef, p), batch, temperature=1.0)
      return jnp.sum(logp * batch["advantages"][:, None])
    return jax.grad(loss)(params)

  fwd = lambda: jax.block_until_ready(grpo.fns.policy_stats(grpo.state.actor, seq))  # noqa: E731
  grad = lambda: jax.block_until_ready(grad_only(grpo.state.actor, mb))  # noqa: E731

  def step():
    grpo.state, metrics = grpo.update_step(grpo.state, mb, jnp.asarray(True))
    float(metrics["loss"])

  # Interleaved: each timed call is paired with a roofline measurement taken right before
  # it, so a fraction compares two figures seen under the same machine load.
  out = {}
  flops = train_flops(cfg, rows_n, p_len, t_len)
  roofs = []
  for name, fn, f in (("forward", fwd, flops / 3), ("grad", grad, flops), ("update", step, flops)):
    t0 = time.perf_counter()
    fn()
    compile_s = time.perf_counter() - t0
    fn()
    times, fractions = [], []
    for _ in range(reps):
      # The first dots after a long step run at ~60 % of the steady rate (threads and
      # caches cold): warm up, then time, so the roofline is the machine's sustained peak.
      median_time(lambda: dot(a, b).block_until_ready(), 10)
      roof = 2 * n ** 3 / median_time(lambda: dot(a, b).block_until_ready(), 5)[0] / 1e9
      t = median_time(fn, 1)[0]
      roofs.append(roof)
      times.append(t)
      fractions.append(f / t / 1e9 / roof)
    t = statistics.median(times)
    out[name] = {"seconds": t, "min": min(times), "max": max(times), "gflops": f / t / 1e9,
                 "paired_fraction": statistics.median(fractions), "first_call_s": compile_s}
  out["roofline_gflops"] = statistics.median(roofs + [roofline])
  for name in ("forward", "grad", "update"):
    out[name]["fraction"] = out[name]["gflops"] / out["roofline_gflops"]
  out["update_gflop"] = flops / 1e9
  out["update_compiles"] = grpo.update_step._cache_size()
  out["shape"] = {**shape, "rows": rows_n, "roofline_n": n, "vocab_size": cfg.vocab_size,
                  "hidden_size": cfg.hidden_size, "num_layers": cfg.num_layers}
  return out


def run_flag_set(name: str, flags: str, reps: int, reduced: bool = False) -> dict:
  env = dict(os.environ, XLA_FLAGS=" ".join(filter(None, [os.environ.get("XLA_FLAGS", ""),
                                                          flags])))
  cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--reps", str(reps)]
  cmd += ["--reduced"] * reduced
  proc = subprocess.run(cmd, env=env, capture_output=True, text=True,
                        cwd=os.path.dirname(os.path.abspath(__file__)))
  lines = [x for x in proc.stdout.splitlines() if x.startswith("WORKER ")]
  if proc.returncode != 0 or not lines:
    err = (proc.stderr.strip().splitlines() or ["?"])[-1]
    print(f"{name:24s} unsupported or failed: {err[:150]}", flush=True)
    return {"error": err[:300]}
  res = json.loads(lines[-1][len("WORKER "):])
  u, fw, g = res["update"], res["forward"], res["grad"]
  print(f"{name:24s} roofline {res['roofline_gflops']:6.1f} GFLOP/s | forward {fw['seconds']:.2f}s "
        f"({fw['fraction']:.0%}) | grad {g['seconds']:.2f}s ({g['fraction']:.0%}) | update "
        f"{u['seconds']:.2f}s = {u['gflops']:.1f} GFLOP/s ({u['fraction']:.0%} of roofline)",
        flush=True)
  return res


def median_run(runs: list[dict]) -> dict:
  """The run with the median update fraction (the first error if every run failed)."""
  ok = sorted((r for r in runs if "error" not in r), key=lambda r: r["update"]["fraction"])
  return ok[len(ok) // 2] if ok else runs[0]


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--reps", type=int, default=5)
  parser.add_argument("--rounds", type=int, default=1,
                      help="run every flag set this many times, in turn; keep the median")
  parser.add_argument("--flags", default="all", help="all | comma list of " + ",".join(FLAG_SETS))
  parser.add_argument("--reduced", action="store_true",
                      help="seconds: the reduced model and rows, --reps 1 --flags baseline "
                      "(CI's run; measures nothing)")
  parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.worker:
    print("WORKER " + json.dumps(worker(args.reps, args.reduced)))
    return
  if args.reduced:
    args.reps, args.flags = 1, "baseline"
  names = list(FLAG_SETS) if args.flags == "all" else args.flags.split(",")
  load_before = os.getloadavg()
  print(f"load average {load_before[0]:.1f} on {os.cpu_count()} cores; XLA_FLAGS per run:")
  runs = {name: [] for name in names}
  for _ in range(args.rounds):
    for name in names:
      runs[name].append(run_flag_set(name, FLAG_SETS[name], args.reps, args.reduced))
  results = {name: median_run(r) for name, r in runs.items()}
  base = results.get("baseline") or next(r for r in results.values() if "error" not in r)
  ok = {k: r for k, r in results.items() if "error" not in r}
  best = max(ok, key=lambda k: ok[k]["update"]["fraction"])
  frac = base["update"]["fraction"]
  res = {
      "metric": "update_flop_utilisation", "rljax": sig(frac),
      "peer": sig(base["roofline_gflops"]), "ratio": sig(frac / TARGET),
      "update_seconds": sig(base["update"]["seconds"]),
      "update_gflops": sig(base["update"]["gflops"]),
      "update_gflop": sig(base["update_gflop"]),
      "paired_fraction": sig(base["update"]["paired_fraction"]),
      "forward_fraction": sig(base["forward"]["fraction"]),
      "grad_fraction": sig(base["grad"]["fraction"]),
      "update_compiles": base["update_compiles"], "target": TARGET,
      "flags_update_fraction": {k: (sig(r["update"]["fraction"]) if "error" not in r
                                    else "unsupported") for k, r in results.items()},
      "rounds": args.rounds, "reps": args.reps, "reduced": args.reduced, "shape": base["shape"],
      "best_flags": FLAG_SETS[best] or "(none)",
      "loadavg_before": [round(x, 2) for x in load_before],
      "loadavg_after": [round(x, 2) for x in os.getloadavg()],
  }
  print(f"\nbaseline: update {res['update_seconds']:.2f} s for {res['update_gflop']:.1f} GFLOP = "
        f"{res['update_gflops']:.1f} GFLOP/s = {frac:.1%} of the {res['peer']:.0f} GFLOP/s "
        f"matmul roofline (target {TARGET:.0%}); best fraction with {best}")
  print("RESULT " + json.dumps(res))


if __name__ == "__main__":
  main()
