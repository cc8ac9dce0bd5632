"""Sampler speed with scanned layers vs one module per layer, in one process.

`sampler_vs_hf.py`'s workload and prompts (rljax side only): the same saved weights loaded
twice, `load_hf(..., scan_layers=True)` and `scan_layers=False`, both compiled and warmed
up, then timed call by call in a shuffled order per round (the same moments of a shared
machine's load for both), `--reps` calls each. Run one batch size per process: batch 64 on
one XLA CPU device per core (`JAX_NUM_CPU_DEVICES=2`, rows data-parallel), batch 8 on one.
The weights are made with torch in this process, which slows later JAX calls (see
sampler_vs_hf.py): compare the two layouts with each other, not with other scripts.

    JAX_NUM_CPU_DEVICES=1 python benchmarks/scan_layers_decode.py --batch 8
    JAX_NUM_CPU_DEVICES=2 python benchmarks/scan_layers_decode.py --batch 64 --devices 2
    python benchmarks/scan_layers_decode.py --reduced   # seconds: CI's run (measures nothing)

Last line: RESULT {"metric": "decode_scanned_over_per_layer", "batch", "devices",
"scanned_ms", "per_layer_ms" (medians of whole generate calls), "rljax" / "peer" (the same
two medians in seconds), "ratio" (median of the per-round ratios scanned / per layer),
"reduced", "load"}. `--reduced`: `workload.REDUCED_HF_CONFIG`, 8 + 8 tokens, batch 4, 3 reps.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time


def timed_calls(models: dict, tokens, reps: int, mesh, new_tokens: int) -> dict:
  """{name: [seconds per generate call]}, the models called in a shuffled order per round."""
  from sampler_vs_hf import time_rljax

  def call(model, seed):
    return time_rljax(model, tokens, seed=seed, mesh=mesh, new_tokens=new_tokens)

  for model in models.values():   # compile and warm up
    call(model, 0)
    call(model, 1)
  times = {name: [] for name in models}
  order, rng = list(models), random.Random(0)
  for i in range(reps):
    rng.shuffle(order)
    for name in order:
      times[name].append(call(models[name], 2 + i))
      time.sleep(0.1)
  return times


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--devices", type=int, default=1, help="rows data-parallel over N")
  parser.add_argument("--reps", type=int, default=None, help="rounds (15; 3 with --reduced)")
  parser.add_argument("--reduced", action="store_true", help="tiny shapes (CI smoke test)")
  args = parser.parse_args()
  if args.reduced:
    args.batch, args.reps = 4, args.reps or 3
  args.reps = args.reps or 15
  import jax
  from sampler_vs_hf import build_models, lengths, prompts

  from rljax.models import load_hf
  from rljax.parallel import make_mesh, shard_model

  with tempfile.TemporaryDirectory() as tmp:
    build_models(save_to=tmp, reduced=args.reduced)
    models = {name: load_hf(tmp, scan_layers=scan)[0]
              for name, scan in (("scanned", True), ("per_layer", False))}
  mesh = None
  if args.devices > 1:
    mesh = make_mesh(data=args.devices, devices=jax.devices()[:args.devices])
    for model in models.values():
      shard_model(model, mesh)
  prompt_len, new_tokens = lengths(args.reduced)
  tokens = prompts(args.batch, models["scanned"].cfg.vocab_size, prompt_len)
  times = timed_calls(models, tokens, args.reps, mesh, new_tokens)
  medians = {name: statistics.median(t) for name, t in times.items()}
  ratio = statistics.median(a / b for a, b in zip(times["scanned"], times["per_layer"]))
  print("RESULT " + json.dumps({
      "metric": "decode_scanned_over_per_layer", "batch": args.batch, "devices": args.devices,
      "scanned_ms": round(1e3 * medians["scanned"], 1),
      "per_layer_ms": round(1e3 * medians["per_layer"], 1),
      "rljax": medians["scanned"], "peer": medians["per_layer"], "ratio": round(ratio, 3),
      "reps": args.reps, "reduced": args.reduced, "load": round(os.getloadavg()[0], 1)}))


if __name__ == "__main__":
  main()
