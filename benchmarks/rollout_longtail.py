"""Long-tailed rollouts: continuous batching vs the static sampler vs `transformers` `generate`.

Workload: the shared benchmark model of benchmarks/README.md (Qwen2 layout, vocab 512, width 256, 4 layers, random
weights built with torch and loaded with `rljax.models.load_hf`), 8 prompts x 8 samples =
64 requests of 32-token prompts, up to 256 new tokens. `--stop-tokens` of the 512 ids end a
completion; the random model's next-token distribution is close to uniform, so each step
stops with probability ~k/512 and lengths are geometric: a long tail (max/mean is printed;
the issue asks for >= 4).

- static: `rljax.sampling.generate`, all 64 rows decode until the longest stops;
- continuous: `rljax.sampling.continuous.generate_continuous` (same tokens, request by
  request, as static). `--slots 0` (the trainer's default): every request resident, the
  rows moved onto half as many slots each time half have finished; `--slots 16`: 16 slots
  refilled from a queue as requests finish;
- HF: `generate` with the stop tokens as eos ids (rows stop, the batch runs to the longest),
  in its own worker process (torch's threads slow JAX in a shared process).

The metric is completed tokens per second: real (unpadded) tokens, stop token included,
over wall time. rljax's two samplers alternate call by call in one process; medians over
`--reps` calls. The figures depend on the CPU (its matmul rate: 325 vs 442 GFLOP/s on the
two machines in benchmarks/README.md) and on the load; the ratios travel better than the rates.

    python benchmarks/rollout_longtail.py [--reps 7] [--slots 0] [--stop-tokens 10]
    python benchmarks/rollout_longtail.py --reduced   # seconds: CI's run (measures nothing)

`--reduced`: `workload.REDUCED_HF_CONFIG` (vocab 64: 4 stop ids stop a row with
probability ~1/16 per step), 2 prompts x 4 samples, up to 32 new tokens, 1 timed call.

Last line: RESULT {"metric": "completed_tokens_per_s_longtail", "rljax": <continuous>,
"peer": <static>, "ratio": ..., "hf": ..., "ratio_vs_hf": ...}.
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

SHAPE = dict(prompts=8, samples=8, prompt_len=32, new_tokens=256)
REDUCED_SHAPE = dict(prompts=2, samples=4, prompt_len=8, new_tokens=32)


def _prompts(vocab, shape):
  import numpy as np
  return np.random.default_rng(0).integers(20, vocab, (shape["prompts"], shape["prompt_len"]))\
      .astype(np.int32)


def hf_worker(args):
  """Times `--reps` HF generate calls on the saved model; prints JSON."""
  import numpy as np
  import torch
  import transformers
  shape = REDUCED_SHAPE if args.reduced else SHAPE
  PROMPT_LEN, NEW_TOKENS = shape["prompt_len"], shape["new_tokens"]  # noqa: N806
  hf = transformers.Qwen2ForCausalLM.from_pretrained(args.model_dir).eval()
  ids = torch.tensor(np.repeat(_prompts(hf.config.vocab_size, shape), shape["samples"], 0),
                     dtype=torch.long)
  stops = list(range(2, 2 + args.stop_tokens))
  times, tokens = [], []
  for i in range(args.reps + 1):
    torch.manual_seed(i)
    t0 = time.perf_counter()
    with torch.inference_mode():
      out = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True,
                        temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=NEW_TOKENS,
                        eos_token_id=stops, pad_token_id=0)
    dt = time.perf_counter() - t0
    gen = out[:, PROMPT_LEN:].numpy()
    is_stop = np.isin(gen, stops)
    first = np.where(is_stop.any(1), is_stop.argmax(1) + 1, gen.shape[1])
    if i:   # the first call warms up
      times.append(dt)
      tokens.append(int(first.sum()))
  print("HF " + json.dumps({"times": times, "tokens": tokens}), flush=True)


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--reps", type=int, default=7)
  ap.add_argument("--slots", type=int, default=0,
                  help="decode slots (0: all 64 requests resident, the trainer's default)")
  ap.add_argument("--stop-tokens", type=int, default=10)
  ap.add_argument("--no-hf", action="store_true")
  ap.add_argument("--reduced", action="store_true",
                  help="seconds: the reduced model and `REDUCED_SHAPE`, --reps 1 --stop-tokens "
                  "4 (CI's run)")
  ap.add_argument("--hf-worker", action="store_true", help=argparse.SUPPRESS)
  ap.add_argument("--model-dir", help=argparse.SUPPRESS)
  args = ap.parse_args()
  if args.hf_worker:
    return hf_worker(args)
  if args.reduced:
    args.reps, args.stop_tokens = 1, 4
  shape = REDUCED_SHAPE if args.reduced else SHAPE
  PROMPTS, SAMPLES, NEW_TOKENS = (  # noqa: N806
      shape[k] for k in ("prompts", "samples", "new_tokens"))

  import jax
  import numpy as np
  from workload import REDUCED_ROOFLINE, matmul_roofline, save_hf, sig

  from rljax.models import load_hf
  from rljax.sampling import SamplingParams, compile_count, generate
  from rljax.sampling.continuous import generate_continuous

  load_before = os.getloadavg()[0]
  peak = matmul_roofline(**REDUCED_ROOFLINE) if args.reduced else matmul_roofline(reps=7)
  with tempfile.TemporaryDirectory() as model_dir:
    save_hf(model_dir, reduced=args.reduced)
    model, cfg = load_hf(model_dir)
    hf = None
    if not args.no_hf:
      cmd = [sys.executable, os.path.abspath(__file__), "--hf-worker", "--model-dir", model_dir,
             "--reps", str(args.reps), "--stop-tokens", str(args.stop_tokens)]
      out = subprocess.run(cmd + ["--reduced"] * args.reduced, capture_output=True, text=True)
      if out.returncode:
        raise RuntimeError(out.stderr[-2000:])
      hf = json.loads(out.stdout.split("HF ")[-1])
  tokens = _prompts(cfg.vocab_size, shape)
  mask = np.ones_like(tokens)
  sampling = SamplingParams(max_new_tokens=NEW_TOKENS, n=SAMPLES,
                            stop_tokens=tuple(range(2, 2 + args.stop_tokens)))
  calls = {
      "static": lambda key: generate(model, tokens, mask, sampling=sampling, rng=key),
      "continuous": lambda key: generate_continuous(
          model, tokens, mask, sampling=sampling, rng=key,
          slots=args.slots or PROMPTS * SAMPLES),
  }
  times = {k: [] for k in calls}
  lengths = {k: [] for k in calls}
  for i in range(args.reps + 1):
    for name in (calls if i % 2 == 0 else list(calls)[::-1]):
      key = jax.random.key(i)
      t0 = time.perf_counter()
      out = calls[name](key)
      out.tokens.block_until_ready()
      dt = time.perf_counter() - t0
      if i:   # the first round compiles
        times[name].append(dt)
        lengths[name].append(np.asarray(out.mask).sum(1))
  same = all((a == b).all() for a, b in zip(lengths["static"], lengths["continuous"]))
  all_lengths = np.concatenate(lengths["static"])
  rate = {k: float(np.median([lens.sum() / t for lens, t in zip(lengths[k], times[k])]))
          for k in calls}
  result = {"metric": "completed_tokens_per_s_longtail", "rljax": sig(rate["continuous"]),
            "peer": sig(rate["static"]), "ratio": sig(rate["continuous"] / rate["static"]),
            "static_s_median": sig(statistics.median(times["static"])),
            "continuous_s_median": sig(statistics.median(times["continuous"])),
            "continuous_s_min_max": [sig(min(times["continuous"])), sig(max(times["continuous"]))],
            "static_s_min_max": [sig(min(times["static"])), sig(max(times["static"]))],
            "reduced": args.reduced, "reps": args.reps, "stop_tokens": args.stop_tokens, **shape,
            "slots": args.slots or PROMPTS * SAMPLES, "requests": PROMPTS * SAMPLES,
            "length_mean": round(float(all_lengths.mean()), 1),
            "length_max": int(all_lengths.max()),
            "max_over_mean": round(float(all_lengths.max() / all_lengths.mean()), 2),
            "same_lengths_static_continuous": bool(same), "programs_compiled": compile_count(),
            "matmul_gflops": round(peak, 1),
            "load_avg_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)]}
  if hf is not None:
    hf_rate = float(np.median([n / t for n, t in zip(hf["tokens"], hf["times"])]))
    result.update(hf=sig(hf_rate), ratio_vs_hf=sig(rate["continuous"] / hf_rate),
                  static_vs_hf=sig(rate["static"] / hf_rate),
                  hf_s_median=sig(statistics.median(hf["times"])))
  print(f"lengths: mean {result['length_mean']}, max {result['length_max']} "
        f"(max/mean {result['max_over_mean']})")
  for k in calls:
    print(f"{k:>10}: {rate[k]:8.0f} completed tok/s  (median {statistics.median(times[k]):.3f} s)")
  if hf is not None:
    print(f"{'HF':>10}: {result['hf']:8.0f} completed tok/s  (median {result['hf_s_median']} s)")
  print("RESULT " + json.dumps(result))


if __name__ == "__main__":
  main()
