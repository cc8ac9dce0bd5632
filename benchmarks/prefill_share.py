"""One prefill per prompt for its n samples vs one per row (GRPO's groups), in both samplers.

Workload: the shared benchmark model of benchmarks/README.md (Qwen2 layout, vocab 512, width 256, 4 layers, random
weights via `transformers` + `rljax.models.load_hf`), 4 prompts of 256 tokens x n = 16
samples = 64 rows, 64 new tokens (no stop token: every row runs the full budget, so the
decode work is the same on both sides and only the prefill differs).

- "prefill cost": a rollout of 1 new token (prefill + one draw), shared vs per-row;
- "whole rollout": 64 new tokens, static sampler (`generate(share_prefill=...)`) and
  continuous sampler (`generate_continuous(share_prefill=...)`, 16 slots).

The two sides alternate call by call in one process; medians over `--reps` calls. The
figures depend on the CPU's matmul rate (printed); the ratios travel better.

    python benchmarks/prefill_share.py [--reps 7]
    python benchmarks/prefill_share.py --reduced   # seconds: CI's run (measures nothing)

`--reduced`: `workload.REDUCED_HF_CONFIG`, 2 prompts of 16 tokens x n = 4, 4 new tokens,
4 slots, 1 timed call per side.

Last line: RESULT {"metric": "rollout_s_n16_prompt256", "rljax": <shared s>, "peer":
<per-row s>, "ratio": per-row / shared (speed-up), "prefill_ratio": ...}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

SHAPE = dict(prompts=4, n=16, prompt_len=256, new_tokens=64, slots=16)
REDUCED_SHAPE = dict(prompts=2, n=4, prompt_len=16, new_tokens=4, slots=4)


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--reps", type=int, default=7)
  ap.add_argument("--reduced", action="store_true",
                  help="seconds: the reduced model and `REDUCED_SHAPE`, --reps 1 (CI's run)")
  args = ap.parse_args()
  if args.reduced:
    args.reps = 1
  shape = REDUCED_SHAPE if args.reduced else SHAPE
  PROMPTS, N, PROMPT_LEN, NEW_TOKENS, SLOTS = (  # noqa: N806
      shape[k] for k in ("prompts", "n", "prompt_len", "new_tokens", "slots"))

  import jax
  import numpy as np
  from workload import REDUCED_ROOFLINE, matmul_roofline, save_hf, sig

  from rljax.models import load_hf
  from rljax.sampling import SamplingParams, generate
  from rljax.sampling.continuous import generate_continuous

  load_before = os.getloadavg()[0]
  peak = matmul_roofline(**REDUCED_ROOFLINE) if args.reduced else matmul_roofline(reps=7)
  with tempfile.TemporaryDirectory() as model_dir:
    save_hf(model_dir, reduced=args.reduced)
    model, cfg = load_hf(model_dir)
  tokens = np.random.default_rng(0).integers(3, cfg.vocab_size, (PROMPTS, PROMPT_LEN))
  mask = np.ones_like(tokens)

  def static(new, share):
    sampling = SamplingParams(max_new_tokens=new, n=N)
    return lambda key: generate(model, tokens, mask, sampling=sampling, rng=key,
                                share_prefill=share)

  def continuous(share):
    sampling = SamplingParams(max_new_tokens=NEW_TOKENS, n=N)
    return lambda key: generate_continuous(model, tokens, mask, sampling=sampling, rng=key,
                                           slots=SLOTS, share_prefill=share)

  pairs = {"prefill (1 new token)": (static(1, True), static(1, False)),
           "static rollout": (static(NEW_TOKENS, True), static(NEW_TOKENS, False)),
           "continuous rollout": (continuous(True), continuous(False))}
  out = {}
  for name, (shared, per_row) in pairs.items():
    times = {"shared": [], "per_row": []}
    first = {}
    for i in range(args.reps + 1):
      order = (("shared", shared), ("per_row", per_row))
      for side, fn in (order if i % 2 == 0 else order[::-1]):
        t0 = time.perf_counter()
        res = fn(jax.random.key(i))
        res.tokens.block_until_ready()
        dt = time.perf_counter() - t0
        if i:
          times[side].append(dt)
        else:
          first[side] = res
    np.testing.assert_array_equal(np.asarray(first["shared"].tokens),
                                  np.asarray(first["per_row"].tokens))   # same rollout
    med = {k: statistics.median(v) for k, v in times.items()}
    out[name] = {"shared_s": sig(med["shared"]), "per_row_s": sig(med["per_row"]),
                 "speedup": sig(med["per_row"] / med["shared"]),
                 "shared_min_max": [sig(min(times["shared"])), sig(max(times["shared"]))],
                 "per_row_min_max": [sig(min(times["per_row"])), sig(max(times["per_row"]))]}
    print(f"{name:>22}: shared {med['shared']:.3f} s, per row {med['per_row']:.3f} s "
          f"-> {out[name]['speedup']:.2f}x")
  # prefill cost = (1-token rollout) - (its one decode draw); the draw is tiny next to a
  # 256-token prefill of 64 rows, so the 1-token call is the prefill's cost
  pre = out["prefill (1 new token)"]
  whole = out["static rollout"]
  result = {"metric": "rollout_s_n16_prompt256", "rljax": whole["shared_s"],
            "peer": whole["per_row_s"], "ratio": whole["speedup"],
            "prefill_ratio": pre["speedup"], "continuous_ratio": out["continuous rollout"]["speedup"],
            "details": out, "matmul_gflops": round(peak, 1), "reps": args.reps,
            "reduced": args.reduced, **shape, "vocab_size": cfg.vocab_size,
            "load_avg_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)]}
  print("RESULT " + json.dumps(result))


if __name__ == "__main__":
  main()
