"""rljax sampler vs `transformers` `generate` on the same random tiny Qwen2 weights.

Workload (the shared one of benchmarks/README.md): Qwen2 layout, vocab 512, width 256, MLP 768, 4 layers,
4 query heads x 64, 2 KV heads, untied lm head, rope θ 1e4; prompts of 32 tokens, exactly
96 sampled tokens (no stop token), temperature 1, no top-k / top-p. The HF model is built
with torch (`torch.manual_seed`), saved with `save_pretrained` and loaded into rljax with
`rljax.models.load_hf`, so both sample from the same weights and the same prompts.

Each side runs in its own worker process (this script with `--worker`). A round starts
one HF and one rljax worker, warms each up with two untimed calls, then asks them for one
generate call at a time, alternating (order flipped every call pair, 0.1 s apart); the
`--reps` calls per side are spread over `--rounds` rounds of fresh workers, and the
ratio is of the medians over all calls. Why: on this shared VM a process's speed depends
on the process and drifts within seconds (the same rljax code measured 57-98 ms per
batch-8 call across fresh processes, HF 185-275 ms within one), so both sides must
sample several processes and the same moments; and once torch's OpenMP pool has run in
a process, the JAX calls made afterwards in it ran ~28 % slower (batch 8, 68 -> 87 ms
median). `--in-process` alternates the calls within this one process instead.

Also reports the fraction of the measured fp32 matmul roofline (1024³ `jnp.dot`) that
each sampler reaches, with FLOPs counted analytically: 2·(matmul
parameters) per position for all prompt + generated positions, plus causal attention
4·H·Dh·ctx per position and layer.

    python benchmarks/sampler_vs_hf.py [--reps 15] [--rounds 3] [--batches 64,8]
                                       [--torch-threads N] [--rljax-devices N] [--in-process]
    python benchmarks/sampler_vs_hf.py --reduced   # seconds: CI's run (measures nothing)

Both sides get the same CPUs. torch splits each op over its threads; the rljax worker runs
`--rljax-devices` XLA CPU devices (`JAX_NUM_CPU_DEVICES`) with the rows data-parallel over
them (`generate(..., mesh=...)`), so each core decodes its own rows without a thread
handoff inside every small matmul; by default one per CPU when each gets >= 32 rows
(batch 64 on 2 CPUs), else one device whose ops use all the threads (batch 8):
`workload.rljax_cpu_devices`.

The machine this runs on is shared: the load average is printed and recorded, and the
figures measured earlier for `transformers` on the idle machine (5,050 / 1,712 tok/s at batch
64 / 8) are reported next to the measured ones (`ratio_vs_reference`). torch's OpenMP
threads degrade badly when the cores are oversubscribed; `--torch-threads 1` shows that.

Last line: RESULT {"metric": "tokens_per_s_batch64", "rljax": ..., "peer": ..., ...}.
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

import jax
import numpy as np
import torch
import transformers
from grpo_vs_trl import HOST_MEMORY, host_memory_environ
from workload import (
  REDUCED,
  REDUCED_ROOFLINE,
  hf_config,
  matmul_roofline,
  rljax_cpu_devices,
  sig,
)

from rljax.models import load_hf
from rljax.parallel import make_mesh, shard_model
from rljax.sampling import SamplingParams, compile_count, generate

PROMPT_LEN, NEW_TOKENS = 32, 96
PEER_REFERENCE = {64: 5050.0, 8: 1712.0}   # transformers eager generate, idle machine (earlier)
WARMUP_CALLS = 2   # untimed calls per side (the first one compiles)
PAUSE_S = 0.1      # between calls, so one side's spinning threads have stopped


def generate_flops(cfg, batch: int, prompt_len: int, new_tokens: int) -> float:
  """Analytic FLOPs of one generate call (2·M·K·N per matmul, causal attention included)."""
  d, f, layers = cfg.hidden_size, cfg.intermediate_size, cfg.num_layers
  h, k, dh, v = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.vocab_size
  per_layer = d * h * dh + 2 * d * k * dh + h * dh * d + 3 * d * f
  matmul_params = layers * per_layer + d * v
  positions = prompt_len + new_tokens
  dense = 2.0 * matmul_params * positions
  attention = 4.0 * h * dh * layers * sum(range(1, positions + 1))
  return batch * (dense + attention)


def lengths(reduced: bool) -> tuple[int, int]:
  """(prompt tokens, new tokens) of a call: the workload's, or `workload.REDUCED`'s."""
  return (REDUCED["prompt_len"], REDUCED["new_tokens"]) if reduced else (PROMPT_LEN, NEW_TOKENS)


def build_models(seed: int = 0, save_to: str | None = None, reduced: bool = False):
  """The seeded HF model (`workload.hf_config`), saved (to `save_to`, or a temporary
  directory), loaded into rljax."""
  torch.manual_seed(seed)
  hf = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**hf_config(reduced))).eval()
  with tempfile.TemporaryDirectory() as tmp:
    path = save_to or tmp
    hf.save_pretrained(path)
    model, cfg = load_hf(path)
  return hf, model, cfg


def prompts(batch: int, vocab_size: int, prompt_len: int = PROMPT_LEN) -> np.ndarray:
  """The benchmark's prompts for one batch size (identical in every worker)."""
  return np.random.default_rng(batch).integers(1, vocab_size, (batch, prompt_len))


def time_hf(hf, tokens: np.ndarray, new_tokens: int = NEW_TOKENS) -> float:
  ids = torch.tensor(tokens)
  with torch.inference_mode():
    t0 = time.perf_counter()
    out = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0,
                      top_k=0, top_p=1.0, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                      eos_token_id=None, pad_token_id=0)
    dt = time.perf_counter() - t0
  assert out.shape == (tokens.shape[0], tokens.shape[1] + new_tokens), out.shape
  return dt


def time_rljax(model, tokens: np.ndarray, seed: int, mesh=None,
               new_tokens: int = NEW_TOKENS) -> float:
  sampling = SamplingParams(max_new_tokens=new_tokens, temperature=1.0)
  t0 = time.perf_counter()
  out = generate(model, tokens, np.ones_like(tokens), sampling=sampling,
                 rng=jax.random.key(seed), mesh=mesh)
  out.tokens.block_until_ready()
  dt = time.perf_counter() - t0
  assert out.tokens.shape == (tokens.shape[0], new_tokens)
  assert int(out.mask.sum()) == tokens.shape[0] * new_tokens
  return dt


def make_sampler(side: str, model_dir: str, batch: int, seed: int, torch_threads: int = 0,
                 devices: int = 1, reduced: bool = False):
  """Load the saved weights into one side; returns call(i) -> seconds for one generate."""
  prompt_len, new_tokens = lengths(reduced)
  if side == "hf":
    if torch_threads:
      torch.set_num_threads(torch_threads)
    hf = transformers.Qwen2ForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tokens = prompts(batch, hf.config.vocab_size, prompt_len)
    return lambda i: time_hf(hf, tokens, new_tokens)
  model, cfg = load_hf(model_dir)
  tokens = prompts(batch, cfg.vocab_size, prompt_len)
  mesh = None
  if devices > 1:   # the worker's JAX_NUM_CPU_DEVICES: rows data-parallel over the devices
    mesh = make_mesh(data=devices, devices=jax.devices()[:devices])
    shard_model(model, mesh)
  return lambda i: time_rljax(model, tokens, seed=seed + i, mesh=mesh, new_tokens=new_tokens)


def serve(args) -> None:
  """Worker: warm up, print READY, then time one call per `run` line read from stdin."""
  transformers.utils.logging.disable_progress_bar()
  call = make_sampler(args.worker, args.model_dir, int(args.batches), args.seed,
                      args.torch_threads, args.rljax_devices, args.reduced)
  first = [call(-1 - i) for i in range(WARMUP_CALLS)][0]
  print(f"READY {first}", flush=True)
  for i, line in enumerate(sys.stdin):
    if line.strip() != "run":
      break
    print(f"TIME {call(i)}", flush=True)
  print("DONE " + json.dumps({"compiled": compile_count() if args.worker == "rljax" else 0}),
        flush=True)


class Worker:
  """One side's sampler in its own process (`serve`), called one generate at a time."""

  def __init__(self, side: str, model_dir: str, batch: int, args):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", side, "--model-dir",
           model_dir, "--batches", str(batch), "--seed", str(args.seed),
           "--torch-threads", str(args.torch_threads),
           "--rljax-devices", str(rljax_devices(args, batch))] + ["--reduced"] * args.reduced
    self.side = side
    env = host_memory_environ(dict(os.environ), args.host_memory)   # both sides the same
    if side == "rljax":
      env["JAX_NUM_CPU_DEVICES"] = str(rljax_devices(args, batch))
    self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                 env=env)
    self.first_s = float(self._expect("READY"))

  def _expect(self, tag: str) -> str:
    for line in self.proc.stdout:
      if line.startswith(tag + " "):
        return line[len(tag) + 1:].strip()
    raise RuntimeError(f"{self.side} worker exited ({self.proc.wait()}) before {tag}")

  def __call__(self, i: int) -> float:
    self.proc.stdin.write("run\n")
    self.proc.stdin.flush()
    return float(self._expect("TIME"))

  def close(self) -> dict:
    self.proc.stdin.close()
    info = json.loads(self._expect("DONE"))
    self.proc.wait()
    return info


def time_pair(model_dir: str, batch: int, reps: int, seed: int, args):
  """`reps` calls per side, alternating HF and rljax call by call (order flipped every
  round, a pause between). Returns (HF seconds, rljax seconds, rljax first call, compiles)."""
  if args.in_process:
    hf = make_sampler("hf", model_dir, batch, seed, args.torch_threads, reduced=args.reduced)
    rl = make_sampler("rljax", model_dir, batch, seed, reduced=args.reduced)
    first = [rl(-1 - i) for i in range(WARMUP_CALLS)][0]
    [hf(-1 - i) for i in range(WARMUP_CALLS)]
  else:
    args_seed = argparse.Namespace(**{**vars(args), "seed": seed})
    hf, rl = Worker("hf", model_dir, batch, args_seed), Worker("rljax", model_dir, batch, args_seed)
    first = rl.first_s
  hf_s, rl_s = [], []
  for i in range(reps):
    for side in ((hf, rl) if i % 2 == 0 else (rl, hf)):
      (hf_s if side is hf else rl_s).append(side(i))
      time.sleep(PAUSE_S)
  compiled = compile_count() if args.in_process else rl.close()["compiled"]
  if not args.in_process:
    hf.close()
  return hf_s, rl_s, first, compiled


def time_rounds(model_dir: str, batch: int, args):
  """`time_pair` in `args.rounds` fresh pairs of workers: a process's speed on this VM
  depends on the process (see the module docstring), so both sides sample several."""
  rounds = 1 if args.in_process else args.rounds
  hf_s, rl_s, first, compiled = [], [], [], 0
  for r in range(rounds):
    reps = args.reps // rounds + (1 if r < args.reps % rounds else 0)
    h, rl, f, c = time_pair(model_dir, batch, reps, args.seed + 1000 * r, args)
    hf_s, rl_s, first, compiled = hf_s + h, rl_s + rl, first + [f], max(compiled, c)
  return hf_s, rl_s, first[0], compiled


def run_batch(model_dir: str, cfg, batch: int, args, peak_gflops: float) -> dict:
  hf_s, rl_s, first_s, compiled = time_rounds(model_dir, batch, args)
  prompt_len, new_tokens = lengths(args.reduced)
  n_tok = batch * new_tokens
  flops = generate_flops(cfg, batch, prompt_len, new_tokens)
  rl, peer = n_tok / statistics.median(rl_s), n_tok / statistics.median(hf_s)
  res = {
      "rljax": sig(rl), "peer": sig(peer), "ratio": sig(rl / peer),
      "rljax_min_max": [sig(n_tok / max(rl_s)), sig(n_tok / min(rl_s))],
      "peer_min_max": [sig(n_tok / max(hf_s)), sig(n_tok / min(hf_s))],
      "gflop_per_call": sig(flops / 1e9),
      "rljax_roofline_fraction": sig(flops / statistics.median(rl_s) / 1e9 / peak_gflops),
      "peer_roofline_fraction": sig(flops / statistics.median(hf_s) / 1e9 / peak_gflops),
      "rljax_first_call_s": round(first_s, 2), "rljax_programs_compiled": compiled,
      "rljax_cpu_devices": 1 if args.in_process else rljax_devices(args, batch),
  }
  if batch in PEER_REFERENCE and not args.reduced:
    res["peer_reference"] = PEER_REFERENCE[batch]
    res["ratio_vs_reference"] = round(rl / PEER_REFERENCE[batch], 3)
  print(f"batch {batch:3d}: rljax {rl:8.0f} tok/s  HF {peer:8.0f} tok/s  ratio {rl / peer:5.2f}x"
        f"  | {flops / 1e9:.1f} GFLOP/call, rljax {res['rljax_roofline_fraction']:.1%} /"
        f" HF {res['peer_roofline_fraction']:.1%} of the matmul roofline"
        f"  | first call (compile) {first_s:.1f} s", flush=True)
  return res


def rljax_devices(args, batch: int) -> int:
  return args.rljax_devices or rljax_cpu_devices(batch, len(os.sched_getaffinity(0)))


def parse_args():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--reps", type=int, default=15, help="timed calls per side and batch")
  parser.add_argument("--rounds", type=int, default=3,
                      help="fresh pairs of worker processes the calls are spread over")
  parser.add_argument("--batches", default="64,8")
  parser.add_argument("--torch-threads", type=int, default=0, help="0: torch's default")
  parser.add_argument("--rljax-devices", type=int, default=0,
                      help="XLA CPU devices of the rljax worker, rows split over them "
                      "(0: one per CPU when each gets >= 32 rows, else 1)")
  parser.add_argument("--host-memory", choices=HOST_MEMORY, default="huge-pages",
                      help="both workers' allocator (grpo_vs_trl.py --host-memory)")
  parser.add_argument("--in-process", action="store_true",
                      help="time both sides in this process (torch's threads then slow JAX)")
  parser.add_argument("--reduced", action="store_true",
                      help="seconds: `workload.REDUCED_HF_CONFIG`, 8 + 8 tokens, batch 4, "
                      "3 calls per side in one round (CI's run; measures nothing)")
  parser.add_argument("--worker", choices=["hf", "rljax"], help=argparse.SUPPRESS)
  parser.add_argument("--model-dir", help=argparse.SUPPRESS)
  parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.reduced and not args.worker:
    args.reps, args.rounds, args.batches = 3, 1, "4"
  return args


def main():
  args = parse_args()
  if args.worker:
    serve(args)
    return
  load_before = os.getloadavg()[0]
  batches = [int(b) for b in args.batches.split(",")]
  print(f"jax {jax.__version__} ({jax.devices()[0].platform}), torch {torch.__version__} "
        f"({args.torch_threads or torch.get_num_threads()} threads), "
        f"transformers {transformers.__version__}; rljax worker: "
        + ", ".join(f"batch {b} on {rljax_devices(args, b)} XLA CPU device(s)" for b in batches)
        + "; "
        f"{'one process' if args.in_process else 'a worker process per side and block'}")
  roof_n = REDUCED_ROOFLINE["n"] if args.reduced else 1024
  peak = matmul_roofline(**REDUCED_ROOFLINE) if args.reduced else matmul_roofline(reps=7)
  print(f"matmul roofline ({roof_n}³ fp32 jnp.dot): {peak:.1f} GFLOP/s")
  with tempfile.TemporaryDirectory() as model_dir:
    _, _, cfg = build_models(save_to=model_dir, reduced=args.reduced)
    results = {b: run_batch(model_dir, cfg, b, args, peak) for b in batches}
  first = batches[0]
  load = [round(load_before, 2), round(os.getloadavg()[0], 2)]
  print(f"load average (1 min) before / after: {load[0]} / {load[1]} on {os.cpu_count()} cores")
  prompt_len, new_tokens = lengths(args.reduced)
  summary = {"metric": f"tokens_per_s_batch{first}", **results[first],
             "matmul_gflops": round(peak, 1), "in_process": args.in_process,
             "reduced": args.reduced, "batch": first, "prompt_len": prompt_len,
             "new_tokens": new_tokens, "reps": args.reps, "vocab_size": cfg.vocab_size,
             "hidden_size": cfg.hidden_size, "num_layers": cfg.num_layers,
             "torch_threads": args.torch_threads or torch.get_num_threads(),
             "load_avg_before_after": load, "cpu_count": os.cpu_count(),
             "host_memory": args.host_memory}
  for b in batches[1:]:
    summary.update({f"{k}_batch{b}": v for k, v in results[b].items()})
  print("RESULT " + json.dumps(summary))


if __name__ == "__main__":
  main()
