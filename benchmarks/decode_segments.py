"""Decode segments as `rljax.sampling.segments.segment_count` picks them vs always
`MAX_SEGMENTS` (`--compare segments`), or the continuous sampler's drain levels down to
`MIN_DRAIN_SLOTS` vs down to one slot (`--compare drain`): call time, peak RSS and compile
time of rljax's samplers.

The static sampler decodes in up to 4 `while_loop`s over growing KV caches, each another
copy of the decode step in the compiled program; `segment_count` keeps them only where the
shorter caches save >= `MIN_SEGMENT_SAVING` of the decode steps' reads: at Qwen2.5-0.5B's
shapes (the default: random weights of its architecture, built with transformers and saved
as safetensors, or `--model-dir` of such a checkpoint) one loop. The continuous sampler's
drain levels (`rljax.sampling.slot_loop.drain_sizes`) are copies too; it stops halving at
`MIN_DRAIN_SLOTS` slots. This measures what each choice costs and saves, with rows that
stop apart (`--stop-tokens` random ids end a completion; 0: every row runs to
`--new-tokens`).

Each (sampler, choice) runs in its own worker process (its own peak RSS, `ru_maxrss`):
`precompile` on the abstract model, `load_hf`, one untimed call, `--reps` timed calls.
`--rounds` rounds alternate the order of the two choices. The other choice sets
`MIN_SEGMENT_SAVING = 0` (every saving pays) or `MIN_DRAIN_SLOTS = 1`. Workers run on XLA's
CPU backend only (`JAX_PLATFORMS=cpu`: an installed libtpu would add ~95 MB to each).
Figures depend on the CPU's memory bandwidth (a decode step streams the weights) and on the
load: compare within one run.

    python benchmarks/decode_segments.py [--model-dir DIR] [--stop-tokens 2500] [--reps 5]
        [--compare segments|drain]
    python benchmarks/decode_segments.py --reduced   # seconds: CI's run (measures nothing)

One RESULT line per sampler: {"metric": "decode_seconds_<sampler>", "rljax": <the rule's
median s>, "peer": <the other choice's median s>, "ratio": peer / rljax, "compare", ...}.
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

SHAPE = dict(batch=8, prompt_len=64, new_tokens=128)
REDUCED_SHAPE = dict(batch=2, prompt_len=8, new_tokens=32)
CHOICES = ("rule", "always")


def worker(spec: dict) -> None:
  """One sampler with one segment choice: compile ahead, load, warm up, time; prints JSON."""
  import jax
  import numpy as np
  from workload import rss_peak_mb

  from rljax.models import abstract_hf, load_hf
  from rljax.sampling import SamplingParams, decode, generate, precompile, segments, slot_loop
  from rljax.sampling.continuous import generate_continuous

  if spec["choice"] == "always" and spec["compare"] == "segments":
    segments.MIN_SEGMENT_SAVING = 0.0
  elif spec["choice"] == "always":
    slot_loop.MIN_DRAIN_SLOTS = 1
  abstract, cfg = abstract_hf(spec["model_dir"])
  rng = np.random.default_rng(1)
  tokens = rng.integers(3, cfg.vocab_size, (spec["batch"], spec["prompt_len"])).astype(np.int32)
  mask = np.ones_like(tokens)
  stops = tuple(int(x) for x in rng.choice(cfg.vocab_size, spec["stop_tokens"], replace=False))
  sampling = SamplingParams(max_new_tokens=spec["new_tokens"], stop_tokens=stops)
  counts = []
  real_count = decode.segment_count
  decode.segment_count = lambda *a: counts.append(real_count(*a)) or counts[-1]
  drains, real_drain = [], slot_loop.drain_sizes
  slot_loop.drain_sizes = lambda *a, **k: drains.append(real_drain(*a, **k)) or drains[-1]
  if spec["sampler"] == "static":
    call = lambda m, seed: generate(m, tokens, mask, sampling=sampling,  # noqa: E731
                                    rng=jax.random.key(seed))
  else:
    call = lambda m, seed: generate_continuous(  # noqa: E731
        m, tokens, mask, sampling=sampling, rng=jax.random.key(seed), slots=spec["batch"])
  t0 = time.perf_counter()
  precompile(call, abstract, 0)
  compile_s = time.perf_counter() - t0
  model, _ = load_hf(spec["model_dir"])
  jax.block_until_ready(call(model, 0).tokens)
  times, lengths = [], []
  for seed in range(1, spec["reps"] + 1):
    t0 = time.perf_counter()
    out = call(model, seed)
    jax.block_until_ready(out.tokens)
    times.append(time.perf_counter() - t0)
    lengths += np.asarray(out.mask).sum(1).tolist()
  print("WORKER " + json.dumps({"times": times, "lengths": lengths, "segments": counts[0],
                                "drain_sizes": drains[0] if drains else None,
                                "rss_mb": rss_peak_mb(), "compile_s": compile_s}), flush=True)


def _run_worker(spec: dict) -> dict:
  env = dict(os.environ, JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"))
  proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker",
                         json.dumps(spec)], capture_output=True, text=True, env=env)
  lines = [x for x in proc.stdout.splitlines() if x.startswith("WORKER ")]
  if proc.returncode or not lines:
    raise SystemExit(f"worker {spec['sampler']} / {spec['choice']} failed:\n"
                     f"{proc.stderr[-3000:]}")
  return json.loads(lines[-1][len("WORKER "):])


def _model_dir(args, tmp: str) -> str:
  """`--model-dir`, or a random-weight checkpoint saved in `tmp` (reduced or Qwen2.5-0.5B)."""
  if args.model_dir:
    return args.model_dir
  if args.reduced:
    from workload import save_hf
    return save_hf(tmp, reduced=True)
  import real_shapes
  spec = {"model_dir": tmp, "hf_config": real_shapes.hf_config(real_shapes.QWEN25_05B)}
  subprocess.run([sys.executable, real_shapes.__file__, "--worker", "save", "--spec",
                  json.dumps(spec)], check=True, capture_output=True)
  return tmp


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--model-dir", default="", help="a Hugging Face Qwen2/Llama checkpoint")
  ap.add_argument("--samplers", default="static,continuous")
  ap.add_argument("--stop-tokens", type=int, default=2500)
  ap.add_argument("--compare", choices=["segments", "drain"], default="segments",
                  help="always MAX_SEGMENTS segments, or drain levels down to one slot")
  ap.add_argument("--reps", type=int, default=5)
  ap.add_argument("--rounds", type=int, default=2)
  ap.add_argument("--reduced", action="store_true",
                  help="seconds: the reduced model, REDUCED_SHAPE, 4 stop ids, 1 rep, 1 round")
  ap.add_argument("--worker", help=argparse.SUPPRESS)
  args = ap.parse_args()
  if args.worker:
    return worker(json.loads(args.worker))
  if args.reduced:
    args.stop_tokens, args.reps, args.rounds = 4, 1, 1
  shape = REDUCED_SHAPE if args.reduced else SHAPE
  from workload import sig
  load_before = os.getloadavg()[0]
  with tempfile.TemporaryDirectory() as tmp:
    model_dir = _model_dir(args, tmp)
    runs = {}
    for r in range(args.rounds):
      for sampler in args.samplers.split(","):
        for choice in (CHOICES if r % 2 == 0 else CHOICES[::-1]):
          spec = dict(shape, model_dir=model_dir, sampler=sampler, choice=choice,
                      stop_tokens=args.stop_tokens, reps=args.reps, compare=args.compare)
          runs.setdefault((sampler, choice), []).append(_run_worker(spec))
  for sampler in args.samplers.split(","):
    got = {c: runs[(sampler, c)] for c in CHOICES}
    median = {c: statistics.median(t for run in got[c] for t in run["times"]) for c in CHOICES}
    lengths = [n for run in got["rule"] for n in run["lengths"]]
    result = {
        "metric": f"decode_seconds_{sampler}", "rljax": sig(median["rule"]),
        "peer": sig(median["always"]), "ratio": sig(median["always"] / median["rule"]),
        "compare": args.compare,
        "segments_rule": got["rule"][0]["segments"], "segments_always": got["always"][0]["segments"],
        "drain_sizes": {c: got[c][0]["drain_sizes"] for c in CHOICES},
        "per_round_medians": {c: [sig(statistics.median(run["times"])) for run in got[c]]
                              for c in CHOICES},
        "rss_mb": {c: [round(run["rss_mb"]) for run in got[c]] for c in CHOICES},
        "compile_s": {c: [round(run["compile_s"], 2) for run in got[c]] for c in CHOICES},
        "same_lengths": all(a["lengths"] == b["lengths"] for a, b in zip(got["rule"],
                                                                         got["always"])),
        "length_mean": round(statistics.mean(lengths), 1), "length_max": max(lengths),
        **shape, "stop_tokens": args.stop_tokens, "reps": args.reps, "rounds": args.rounds,
        "reduced": args.reduced,
        "load_avg_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)]}
    drain = result["drain_sizes"]
    print(f"{sampler}: rule {result['segments_rule']} segment(s), drain {drain['rule']}: "
          f"{median['rule']:.3f} s; other {result['segments_always']}, {drain['always']}: "
          f"{median['always']:.3f} s; peak RSS "
          f"{result['rss_mb']}; compile {result['compile_s']}", flush=True)
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
  main()
