"""How one rljax GRPO iteration (rollout + update) scales with batch, length and width.

Starts from the shared workload of benchmarks/README.md (tiny Qwen2: vocab 512,
width 256, MLP 768 = 3·width, 4 layers, 4 heads x 64, 2 KV heads; 8 prompts x 8
generations, prompts of 32 tokens, 96 new tokens) and varies one thing at a time,
three values each, with the trainer's own pieces (`workload.RljaxGRPO`: `generate` ->
jitted `update_step` with `old_logp_source="update"`; the separate old-log-prob forward of
the default "recompute" is timed in its own column, outside the iteration time):

  batch  : completions per iteration 32 / 64 / 128 (prompts 4 / 8 / 16, n = 8)
  length : new tokens 48 / 96 / 192
  width  : hidden size 128 / 256 / 512 (MLP 3x, heads of 64: 2 / 4 / 8 heads, 1 / 2 / 4 KV)

Each cell is the median of `--reps` iterations after one compile-and-warm-up iteration.
Next to the time it prints the analytic FLOPs (2·M·K·N per matmul,
x3 for the update) and the time relative to the middle value, so one can read whether
costs grow as the FLOPs do (batch: linear; length: slightly super-linear through
attention, plus the sequential decode; width: ~quadratic in the matmuls).

    python benchmarks/scaling.py [--reps 2]      # about 4-5 minutes on the 2-core machine
    python benchmarks/scaling.py --reduced       # seconds: CI's run (measures nothing)

`--reduced`: the reduced model (`workload.REDUCED_HF_CONFIG`: vocabulary 64, 2 layers,
width 32, MLP 64, heads of 16), 1 or 2 prompts x 2 samples of 8 + 8 tokens: two cells (the
batch sweep; the other sweeps hold only the base value), --reps 1.

Last line: RESULT {"metric": "iteration_seconds_scaling", "rljax": <base seconds>, ...}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import numpy as np
from sampler_vs_hf import generate_flops
from update_roofline import train_flops
from workload import PROMPT_LEN, REDUCED, RljaxGRPO, build_hf, load_into_rljax, sig

# the sweeps: the middle value is the base; heads of `head_dim`, MLP `mlp` x width
FULL = dict(base={"prompts": 8, "new_tokens": 96, "width": 256}, group=8, head_dim=64, mlp=3,
            prompt_len=PROMPT_LEN, layers=None,
            sweeps={"batch": ("prompts", (4, 8, 16)), "length": ("new_tokens", (48, 96, 192)),
                    "width": ("width", (128, 256, 512))})
# the base cell is grpo_vs_trl.py --reduced's rljax side (same programs, so a shared
# compilation cache serves both)
REDUCED_SWEEP = dict(base={"prompts": REDUCED["prompts"], "new_tokens": REDUCED["new_tokens"],
                           "width": 32},
                     group=REDUCED["group"], head_dim=16, mlp=2, prompt_len=REDUCED["prompt_len"],
                     layers=2, sweeps={"batch": ("prompts", (1, 2)), "length": ("new_tokens", (8,)),
                                       "width": ("width", (32,))})


def run_cell(prompts: int, new_tokens: int, width: int, reps: int, plan: dict,
             reduced: bool = False) -> dict:
  heads = width // plan["head_dim"]
  layers = {"num_hidden_layers": plan["layers"]} if plan["layers"] else {}
  hf = build_hf(reduced=reduced, hidden_size=width, intermediate_size=plan["mlp"] * width,
                num_attention_heads=heads, num_key_value_heads=max(1, heads // 2),
                head_dim=plan["head_dim"], **layers)
  model, cfg = load_into_rljax(hf)
  group, prompt_len = plan["group"], plan["prompt_len"]
  grpo = RljaxGRPO(model, group=group, new_tokens=new_tokens)
  ids = np.random.default_rng(0).integers(2, cfg.vocab_size, (reps + 1, prompts, prompt_len))
  grpo.iteration(ids[0], 0)                     # compile + warm-up
  times = [grpo.iteration(ids[i], i) for i in range(1, reps + 1)]
  b = prompts * group
  gen_gflop = generate_flops(cfg, b, prompt_len, new_tokens) / 1e9
  upd_gflop = train_flops(cfg, b, prompt_len, new_tokens) / 1e9
  med = {k: statistics.median(t[k] for t in times) for k in ("generate", "old_logp", "update",
                                                               "total")}
  med["gflop"] = gen_gflop + upd_gflop
  return med


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--reps", type=int, default=2)
  parser.add_argument("--reduced", action="store_true",
                      help="seconds: `REDUCED_SWEEP`, --reps 1 (CI's run; measures nothing)")
  args = parser.parse_args()
  if args.reduced:
    args.reps = 1
  plan = REDUCED_SWEEP if args.reduced else FULL
  load_before = os.getloadavg()
  cache: dict[tuple, dict] = {}
  rows = []
  for sweep, (key, values) in plan["sweeps"].items():
    for v in values:
      cell = dict(plan["base"], **{key: v})
      k = tuple(cell.values())
      if k not in cache:
        cache[k] = run_cell(cell["prompts"], cell["new_tokens"], cell["width"], args.reps, plan,
                            args.reduced)
      rows.append((sweep, cell, cache[k]))
      r = cache[k]
      print(f"{sweep:6s} {key}={v:4d}: total {r['total']:.2f}s (generate {r['generate']:.2f}, "
            f"old_logp {r['old_logp']:.2f}, update {r['update']:.2f})", flush=True)
  base = cache[tuple(plan["base"].values())]
  group = plan["group"]
  print(f"\nload average {load_before[0]:.1f} -> {os.getloadavg()[0]:.1f} on {os.cpu_count()} "
        f"cores; medians of {args.reps} iterations\n")
  print("| varied | completions | new tokens | width | generate s | old_logp s | update s "
        "| iteration s | x base time | x base GFLOP |")
  print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
  for sweep, cell, r in rows:
    print(f"| {sweep} | {cell['prompts'] * group} | {cell['new_tokens']} | {cell['width']} | "
          f"{r['generate']:.2f} | {r['old_logp']:.2f} | {r['update']:.2f} | {r['total']:.2f} | "
          f"{r['total'] / base['total']:.2f} | {r['gflop'] / base['gflop']:.2f} |")
  res = {"metric": "iteration_seconds_scaling", "rljax": sig(base["total"]), "peer": None,
         "ratio": None, "reps": args.reps, "reduced": args.reduced, "group": group,
         "prompt_len": plan["prompt_len"], "base": plan["base"],
         "table": [{"varied": s, **c, "seconds": sig(r["total"]), "gflop": sig(r["gflop"])}
                   for s, c, r in rows],
         "loadavg_before": [round(x, 2) for x in load_before],
         "loadavg_after": [round(x, 2) for x in os.getloadavg()]}
  print("RESULT " + json.dumps(res))


if __name__ == "__main__":
  main()
