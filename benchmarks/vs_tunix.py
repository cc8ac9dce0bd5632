"""rljax against Tunix, the JAX peer, on the same XLA, CPU and weights: sampler, one GRPO
iteration, peak memory.

Model: one random-weight Qwen2 checkpoint per run, built with `transformers` from a fixed
seed and saved with `save_pretrained` (safetensors); rljax loads it with
`rljax.models.load_hf`, Tunix with its own loader
(`tunix.models.qwen2.params.create_model_from_safe_tensors`). float32 on both sides. Both
sides report the teacher-forced logits of two prompts from the weights they loaded; the
script stops (exit status 2) when they differ. `--shape toy` is the shared workload of
benchmarks/README.md (vocab 512, width 256, 4 layers; 32 + 96 tokens), `qwen25_05b`
Qwen2.5-0.5B's shapes (real_shapes.py; 64 + 128 tokens), `--reduced` a model that runs in
seconds (CI).

Each part runs each side in its own worker process (this script with `--worker`), pinned to
the same CPUs (`--threads`; XLA sizes its thread pool from the affinity), one XLA CPU device
each; the configurations are printed side by side and the script exits with status 2,
naming the field, when they differ (`grpo_vs_trl.check_configs`):

  (a) sampler, per batch size: rljax's static `generate` and continuous sampler (every
      row resident) against Tunix's vanilla `Sampler`, the same prompt ids (Tunix gets
      them as words of a word-level tokenizer, checked to round-trip), temperature 1,
      top_p 1, no top-k, exactly `new_tokens` tokens per row (Tunix's pad and eos ids lie
      outside the vocabulary: nothing stops a row). Calls alternate between the workers.
  (b) one GRPO iteration: rljax's trainer internals (`workload.RljaxGRPO`, as
      grpo_vs_trl.py) against Tunix's `GRPOLearner` through `RLCluster` with its vanilla
      rollout (`tunix_side.py`): prompts x group completions, random rewards, group
      mean / std advantages, PPO clip 0.2, `seq_mean_token_mean` (Tunix
      `sequence-mean-token-mean`), no KL, one AdamW update (lr 1e-5, clip 1.0) per
      rollout, no activation checkpointing. Split into generation (Tunix's with its
      rewards and advantages; rljax computes the advantages in its update), update, and a
      log-prob forward of the current policy on the rollout (neither side needs one in
      this configuration; timed outside the iteration).
  (c) peak memory: each worker's `ru_maxrss` (ratio = Tunix / rljax, >= 1: rljax smaller);
      each sampler (static, continuous, Tunix's) in a worker of its own.

Each part prints `RESULT {"metric", "rljax", "peer", "ratio", ...}`: times are medians
over `--reps` calls or iterations after `--warmup` (min-max beside them), ratio = Tunix time
/ rljax time (> 1: rljax is faster). The load average and the 1024³ matmul rate
(`workload.matmul_roofline`) are printed and recorded. Needs Tunix (pyproject's `tunix`
extra, in a venv of its own: it takes transformers back to 5.12).

    python benchmarks/vs_tunix.py [--shape toy|qwen25_05b] [--parts sampler,grpo]
        [--batches 64,8] [--reps 5] [--rounds 3] [--warmup 2] [--threads N] [--schedule auto]
    python benchmarks/vs_tunix.py --reduced   # seconds: CI's run (measures nothing)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
from grpo_vs_trl import (
  HOST_MEMORY,
  Worker,
  check_configs,
  print_configs,
  rljax_worker,
  run_pair,
  summarise,
)
from real_shapes import (
  QWEN25_05B,
  SAMPLER_COMPARED,
  hf_config,
  rljax_sampler_worker,
  save_worker,
)
from workload import (
  HF_CONFIG,
  REDUCED,
  REDUCED_HF_CONFIG,
  REDUCED_ROOFLINE,
  matmul_roofline,
  sig,
  weight_stream_gbps,
)

# shape -> (HF config, prompt tokens, new tokens, sampler batches, GRPO prompts x group)
SHAPES = {
    "toy": (HF_CONFIG, 32, 96, (64, 8), (8, 8)),
    "qwen25_05b": (hf_config(QWEN25_05B), 64, 128, (8,), (1, 8)),
    "reduced": (REDUCED_HF_CONFIG, REDUCED["prompt_len"], REDUCED["new_tokens"], (4,),
                (REDUCED["prompts"], REDUCED["group"])),
}
SAMPLERS = ("static", "continuous", "tunix")   # one worker each
PROBE_TOL = 1e-4   # x max(1, max |logit|): float32 op-order differences are ~1e-7 here


def result(metric: str, rljax, peer, *, matmul_gflops: float, **extra) -> dict:
  """A RESULT line (printed) and its dict: ratio = peer / rljax, the load average now and
  the matmul rate measured at the start."""
  res = {"metric": metric, "rljax": rljax, "peer": peer, "ratio": sig(peer / rljax), **extra,
         "matmul_gflops": sig(matmul_gflops), "loadavg": round(os.getloadavg()[0], 2)}
  print("RESULT " + json.dumps(res), flush=True)
  return res


def times(values) -> dict:
  return {"median": sig(statistics.median(values)), "min_max": [sig(min(values)),
                                                                sig(max(values))]}


def check_probes(configs: dict) -> None:
  """Exits with status 2 when the two loaders' weights give different logits."""
  a, b = (np.asarray(c["logits_probe"]) for c in configs.values())
  diff, bound = float(np.max(np.abs(a - b))), PROBE_TOL * max(1.0, float(np.max(np.abs(a))))
  print(f"logits of the loaded weights (2 prompts, last position): max |rljax - tunix| "
        f"{diff:.2e}", flush=True)
  if not diff <= bound:
    print(f"\nFAIL: the two loaders' weights differ (max logit difference {diff:.3g} > "
          f"{bound:.3g})", flush=True)
    raise SystemExit(2)


def sampler_round(spec: dict, reps: int, batch: int):
  """One round of (a): fresh workers, one per sampler, `reps` alternating calls each.
  Returns (per-sampler call seconds, per-sampler `close()` reports, the configs)."""
  workers = {}   # one process per sampler, so that each peak RSS is that sampler's alone
  try:
    for name in SAMPLERS:
      side = "tunix" if name == "tunix" else "rljax"
      workers[name] = Worker(side + "_sampler", {**spec, "variants": [name]}, script=__file__)
    for name in SAMPLERS[:2]:
      configs = {"rljax": workers[name].config, "tunix": workers["tunix"].config}
      print_configs(configs, SAMPLER_COMPARED + ("xla_cpu_devices",))
      check_configs(configs, SAMPLER_COMPARED + ("xla_cpu_devices",), "sampler configuration")
      check_probes(configs)
    for w in workers.values():   # a warm-up beside a timed call slowed it (0.5B: 18.5 vs 7.2 s)
      w.wait_ready()
    calls: dict[str, list[float]] = {}
    for i in range(reps):
      for name in (SAMPLERS if i % 2 == 0 else SAMPLERS[::-1]):
        calls.setdefault(name, []).append(workers[name].step()[name])
      print(f"  batch {batch} call {i + 1}: " + ", ".join(f"{k} {v[-1]:.3f}s"
                                                          for k, v in calls.items()), flush=True)
    done = {s: w.close() for s, w in workers.items()}
  finally:
    for w in workers.values():
      w.kill()
  return calls, done, configs


def run_sampler(model_dir: str, args, batch: int) -> list[dict]:
  """(a) and its part of (c) at one batch size: `--reps` calls per sampler spread over
  `--rounds` rounds of fresh workers (on this VM a process's speed depends on the process);
  the peak RSS is the largest over the rounds."""
  spec = {"model_dir": model_dir, "batch": batch, "prompt_len": args.prompt_len,
          "new_tokens": args.new_tokens, "threads": args.threads, "warmup": args.warmup,
          "probe": True, "host_memory": args.host_memory}
  calls, peaks, round_medians = {}, {}, {}
  for r in range(args.rounds):
    reps = args.reps // args.rounds + (1 if r < args.reps % args.rounds else 0)
    round_calls, done, configs = sampler_round(spec, reps, batch)
    for name, values in round_calls.items():
      calls.setdefault(name, []).extend(values)
      round_medians.setdefault(name, []).append(sig(statistics.median(values)))
      peaks[name] = max(peaks.get(name, 0.0), done[name]["rss_peak_mb"])
  tokens = batch * args.new_tokens
  # each decode step reads every weight once: bytes x steps / time, against what a
  # [batch, width] @ lm-head product streams here (`workload.weight_stream_gbps`)
  weight_gb = done["static"]["param_mb"] * 2 ** 20 * args.new_tokens / 1e9
  common = dict(batch=batch, prompt_len=args.prompt_len, new_tokens=args.new_tokens,
                shape=args.shape, reps=args.reps, rounds=args.rounds,
                weight_stream_gb_per_s=args.weight_stream and sig(args.weight_stream),
                threads=configs["rljax"]["threads"], tunix_version=configs["tunix"]["tunix"],
                matmul_gflops=args.roofline)
  out = []
  peer = times(calls["tunix"])
  for name in ("static", "continuous"):
    rl = times(calls[name])
    out.append(result(f"sampler_seconds_batch{batch}_{name}", rl["median"], peer["median"],
                      rljax_min_max=rl["min_max"], peer_min_max=peer["min_max"],
                      rljax_round_medians=round_medians[name],
                      peer_round_medians=round_medians["tunix"],
                      rljax_tokens_per_s=sig(tokens / rl["median"]),
                      peer_tokens_per_s=sig(tokens / peer["median"]),
                      rljax_weight_gb_per_s=sig(weight_gb / rl["median"]),
                      peer_weight_gb_per_s=sig(weight_gb / peer["median"]), **common))
  for name in SAMPLERS[:2]:
    out.append(result(f"sampler_peak_rss_mb_batch{batch}_{name}", peaks[name], peaks["tunix"],
                      batch=batch, shape=args.shape, rounds=args.rounds,
                      matmul_gflops=args.roofline,
                      note="ru_maxrss of each sampler's worker (largest over the rounds); "
                           "ratio = Tunix / rljax"))
  return out


def run_grpo(model_dir: str, args) -> list[dict]:
  """(b) and its part of (c), through grpo_vs_trl's protocol and checks."""
  prompts, group = args.grpo
  spec = {"model_dir": model_dir, "prompts": prompts, "group": group,
          "prompt_len": args.prompt_len, "new_tokens": args.new_tokens, "stop_tokens": [],
          "pack": False, "loss_agg": "seq_mean_token_mean", "lr": 1e-5,
          "threads": args.threads, "rljax_devices": 1, "steps": args.warmup + args.reps,
          "time_recompute": True, "host_memory": args.host_memory}
  runs = run_pair(spec, schedule=args.schedule, sides=("rljax", "tunix"), script=__file__)
  med = summarise(runs, args.warmup)
  rl, peer = med["rljax"], med["tunix"]
  parts = {k: (sig(rl[k]), sig(peer[k]), sig(peer[k] / rl[k]))
           for k in ("generate", "update", "old_logp")}
  cfg = runs["rljax"]["config"]
  grpo = result(
      "grpo_iteration_seconds", sig(rl["total"]), sig(peer["total"]),
      **{f"{side}_{k}": v[i] for k, v in parts.items()
         for i, side in enumerate(("rljax", "peer"))},
      **{f"ratio_{k}": v[2] for k, v in parts.items()},
      rljax_min_max=rl["min_max"], peer_min_max=peer["min_max"],
      rljax_cpu_s=round(rl["cpu_s"], 2), peer_cpu_s=round(peer["cpu_s"], 2),
      config={k: cfg[k] for k in ("prompts", "group", "completions", "prompt_len",
                                  "new_tokens", "loss_agg", "dtype", "optimizer", "lr")},
      completion_tokens=runs["tunix"]["steps"][-1]["tokens"], shape=args.shape,
      # XLA compilations inside Tunix's timed iterations (0: they are steady state)
      peer_timed_compiles=sum(s["compiles"] for s in runs["tunix"]["steps"][args.warmup:]),
      peer_rss_after_steps_mb=[s["rss_mb"] for s in runs["tunix"]["steps"]],
      reps=args.reps, warmup=args.warmup, schedule=args.schedule, threads=cfg["threads"],
      tunix_version=runs["tunix"]["config"]["tunix"], matmul_gflops=args.roofline,
      note="Tunix's generate includes its rewards and advantages, rljax's update its "
           "advantages (random rewards: microseconds); old_logp: a log-prob forward of the "
           "updated policy on the rollout, outside the iteration")
  rss = result("grpo_peak_rss_mb", runs["rljax"]["done"]["rss_peak_mb"],
               runs["tunix"]["done"]["rss_peak_mb"], shape=args.shape, matmul_gflops=args.roofline,
               note="ru_maxrss of each GRPO worker; ratio = Tunix / rljax")
  return [grpo, rss]


def save_model(model_dir: str, args) -> None:
  """The seeded random-weight checkpoint (real_shapes.py's save worker, in a subprocess),
  unless `model_dir` holds one."""
  if not os.path.exists(os.path.join(model_dir, "config.json")):
    spec = {"model_dir": model_dir, "hf_config": args.hf_config}
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", "save",
                           "--spec", json.dumps(spec)], capture_output=True, text=True)
    if proc.returncode or "SAVED " not in proc.stdout:
      raise SystemExit(f"saving the model failed:\n{proc.stderr[-2000:]}")


def parse_args():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--shape", default="toy", choices=["toy", "qwen25_05b"])
  parser.add_argument("--parts", default="sampler,grpo")
  parser.add_argument("--batches", default="", help="sampler batch sizes (default: the shape's)")
  parser.add_argument("--reps", type=int, default=5, help="timed calls / iterations per side")
  parser.add_argument("--rounds", type=int, default=0,
                      help="sampler: fresh workers this many times, --reps spread over them "
                      "(0: 3 at the toy shape, 1 otherwise)")
  parser.add_argument("--warmup", type=int, default=2,
                      help="untimed calls / iterations per side (Tunix compiles twice)")
  parser.add_argument("--threads", type=int, default=0, help="CPUs per side (0: all)")
  parser.add_argument("--schedule", default="auto", choices=["auto", "alternate", "sequential"],
                      help="GRPO workers' steps; auto: alternate, sequential at 0.5B (memory)")
  parser.add_argument("--host-memory", choices=HOST_MEMORY, default="huge-pages",
                      help="both sides' allocator (grpo_vs_trl.py --host-memory)")
  parser.add_argument("--model-dir", default="", help="reuse (or keep) the saved checkpoint")
  parser.add_argument("--reduced", action="store_true",
                      help="seconds: the reduced model, 8 + 8 tokens, batch 4, GRPO 2 x 2, "
                      "--reps 2 (CI's run; measures nothing)")
  parser.add_argument("--worker", help=argparse.SUPPRESS)
  parser.add_argument("--spec", help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.worker:
    return args
  if args.warmup < 2:
    parser.error("--warmup must be >= 2: Tunix's sampler compiles on its first two calls")
  if args.reduced:
    args.shape, args.reps, args.rounds = "reduced", 2, args.rounds or 1
  if args.rounds == 0:
    args.rounds = 3 if args.shape == "toy" else 1
  if not 1 <= args.rounds <= args.reps:
    parser.error(f"--rounds must be in [1, --reps={args.reps}], got {args.rounds}")
  args.hf_config, args.prompt_len, args.new_tokens, batches, args.grpo = SHAPES[args.shape]
  args.batches = [int(b) for b in args.batches.split(",")] if args.batches else list(batches)
  if args.schedule == "auto":
    args.schedule = "sequential" if args.shape == "qwen25_05b" else "alternate"
  return args


def main():
  args = parse_args()
  if args.worker:
    import tunix_side

    workers = {"save": save_worker, "rljax_sampler": rljax_sampler_worker,
               "tunix_sampler": tunix_side.sampler_worker, "rljax": rljax_worker,
               "tunix": tunix_side.grpo_worker}
    workers[args.worker](json.loads(args.spec))
    return
  load_before = os.getloadavg()
  args.roofline = matmul_roofline(**REDUCED_ROOFLINE) if args.reduced else matmul_roofline()
  args.weight_stream = weight_stream_gbps() if args.shape == "qwen25_05b" else None
  print(f"shape {args.shape} ({args.hf_config['num_hidden_layers']} layers, width "
        f"{args.hf_config['hidden_size']}, vocab {args.hf_config['vocab_size']}), "
        f"{args.prompt_len} + {args.new_tokens} tokens; load average {load_before[0]:.2f} on "
        f"{os.cpu_count()} cores; matmul roofline {args.roofline:.1f} GFLOP/s; host memory "
        f"{args.host_memory} (both sides)" + (f"; weight stream {args.weight_stream:.1f} GB/s"
                                              if args.weight_stream else ""), flush=True)
  with tempfile.TemporaryDirectory(prefix="vs_tunix_") as tmp:
    model_dir = args.model_dir or tmp
    t0 = time.perf_counter()
    save_model(model_dir, args)
    print(f"checkpoint in {model_dir} ({time.perf_counter() - t0:.0f} s)", flush=True)
    if "sampler" in args.parts:
      for batch in args.batches:
        run_sampler(model_dir, args, batch)
    if "grpo" in args.parts:
      run_grpo(model_dir, args)
  roof_after = matmul_roofline(**REDUCED_ROOFLINE) if args.reduced else matmul_roofline()
  print(f"load average (1 min) before / after: {load_before[0]:.2f} / "
        f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; matmul roofline before / after: "
        f"{args.roofline:.1f} / {roof_after:.1f} GFLOP/s")

if __name__ == "__main__":
  main()
