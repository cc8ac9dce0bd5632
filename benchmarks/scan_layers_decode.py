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

Last line: RESULT {"metric": "decode_scanned_over_per_layer", "batch", "devices",
"scanned_ms", "per_layer_ms" (medians of whole generate calls), "ratio" (median of the
per-round ratios scanned / per layer), "load"}.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time


def timed_calls(models: dict, tokens, reps: int, mesh) -> dict:
  """{name: [seconds per generate call]}, the models called in a shuffled order per round."""
  from sampler_vs_hf import time_rljax

  for model in models.values():   # compile and warm up
    time_rljax(model, tokens, seed=0, mesh=mesh)
    time_rljax(model, tokens, seed=1, mesh=mesh)
  times = {name: [] for name in models}
  order, rng = list(models), random.Random(0)
  for i in range(reps):
    rng.shuffle(order)
    for name in order:
      times[name].append(time_rljax(models[name], tokens, seed=2 + i, mesh=mesh))
      time.sleep(0.1)
  return times


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--devices", type=int, default=1, help="rows data-parallel over N")
  parser.add_argument("--reps", type=int, default=15)
  args = parser.parse_args()
  import jax
  from sampler_vs_hf import build_models, prompts

  from rljax.models import load_hf
  from rljax.parallel import make_mesh, shard_model

  with tempfile.TemporaryDirectory() as tmp:
    build_models(save_to=tmp)
    models = {name: load_hf(tmp, scan_layers=scan)[0]
              for name, scan in (("scanned", True), ("per_layer", False))}
  mesh = None
  if args.devices > 1:
    mesh = make_mesh(data=args.devices, devices=jax.devices()[:args.devices])
    for model in models.values():
      shard_model(model, mesh)
  tokens = prompts(args.batch, models["scanned"].cfg.vocab_size)
  times = timed_calls(models, tokens, args.reps, mesh)
  ratio = statistics.median(a / b for a, b in zip(times["scanned"], times["per_layer"]))
  print("RESULT " + json.dumps({
      "metric": "decode_scanned_over_per_layer", "batch": args.batch, "devices": args.devices,
      "scanned_ms": round(1e3 * statistics.median(times["scanned"]), 1),
      "per_layer_ms": round(1e3 * statistics.median(times["per_layer"]), 1),
      "ratio": round(ratio, 3), "load": round(os.getloadavg()[0], 1)}))


if __name__ == "__main__":
  main()
