"""rljax sampler vs `transformers` `generate` on the same random tiny Qwen2 weights.

Workload (../shared/PERF_NOTES.md): Qwen2 layout, vocab 512, width 256, MLP 768, 4 layers,
4 query heads x 64, 2 KV heads, untied lm head, rope θ 1e4; prompts of 32 tokens, exactly
96 sampled tokens (no stop token), temperature 1, no top-k / top-p. The HF model is built
with torch (`torch.manual_seed`), saved with `save_pretrained` and loaded into rljax with
`rljax.models.load_hf`, so both sample from the same weights. Runs are interleaved
(HF, rljax, HF, ...) so both see the same machine load; medians after warm-up.

Also reports the fraction of the measured fp32 matmul roofline (1024³ `jnp.dot`) that
each sampler reaches, with FLOPs counted analytically as in PERF_NOTES: 2·(matmul
parameters) per position for all prompt + generated positions, plus causal attention
4·H·Dh·ctx per position and layer.

    python benchmarks/sampler_vs_hf.py [--reps 7] [--batches 64,8] [--torch-threads N]

The machine this runs on is shared: the load average is printed and recorded, and the
PERF_NOTES figures for `transformers` on the idle machine (5,050 / 1,712 tok/s at batch
64 / 8) are reported next to the measured ones (`ratio_vs_reference`). torch's OpenMP
threads degrade badly when the cores are oversubscribed; `--torch-threads 1` shows that.

Last line: RESULT {"metric": "tokens_per_s_batch64", "rljax": ..., "peer": ..., ...}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers

from rljax.models import load_hf
from rljax.sampling import SamplingParams, compile_count, generate

HF_CONFIG = dict(vocab_size=512, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                 rope_theta=10000.0, tie_word_embeddings=False, rms_norm_eps=1e-6)
PROMPT_LEN, NEW_TOKENS = 32, 96
PEER_REFERENCE = {64: 5050.0, 8: 1712.0}   # PERF_NOTES: transformers eager generate, idle machine


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


def matmul_gflops(n: int = 1024, reps: int = 7) -> float:
  """Measured fp32 matmul throughput of `jnp.dot` on n x n x n (median GFLOP/s)."""
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
  b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
  dot = jax.jit(jnp.dot)
  for _ in range(10):   # to the sustained rate (the first calls run slower)
    dot(a, b).block_until_ready()
  times = []
  for _ in range(reps):
    t0 = time.perf_counter()
    dot(a, b).block_until_ready()
    times.append(time.perf_counter() - t0)
  return 2 * n ** 3 / statistics.median(times) / 1e9


def build_models(seed: int = 0):
  torch.manual_seed(seed)
  hf = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**HF_CONFIG)).eval()
  with tempfile.TemporaryDirectory() as path:
    hf.save_pretrained(path)
    model, cfg = load_hf(path)
  return hf, model, cfg


def time_hf(hf, tokens: np.ndarray) -> float:
  ids = torch.tensor(tokens)
  with torch.inference_mode():
    t0 = time.perf_counter()
    out = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0,
                      top_k=0, top_p=1.0, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                      eos_token_id=None, pad_token_id=0)
    dt = time.perf_counter() - t0
  assert out.shape == (tokens.shape[0], PROMPT_LEN + NEW_TOKENS), out.shape
  return dt


def time_rljax(model, tokens: np.ndarray, seed: int) -> float:
  sampling = SamplingParams(max_new_tokens=NEW_TOKENS, temperature=1.0)
  t0 = time.perf_counter()
  out = generate(model, tokens, np.ones_like(tokens), sampling=sampling,
                 rng=jax.random.key(seed))
  out.tokens.block_until_ready()
  dt = time.perf_counter() - t0
  assert out.tokens.shape == (tokens.shape[0], NEW_TOKENS)
  assert int(out.mask.sum()) == tokens.size // PROMPT_LEN * NEW_TOKENS
  return dt


def run_batch(hf, model, cfg, batch: int, reps: int, peak_gflops: float) -> dict:
  tokens = np.random.default_rng(batch).integers(1, cfg.vocab_size, (batch, PROMPT_LEN))
  t0 = time.perf_counter()
  time_rljax(model, tokens, seed=0)                   # compile
  compile_s = time.perf_counter() - t0
  # Blocks of calls, each after one untimed call: after a call, torch's OpenMP threads keep
  # spinning for a while and would slow an interleaved JAX call (and the reverse).
  hf_s, rl_s = [], []
  seeds = iter(range(1, 10 * reps + 10))
  for block in range(2):
    n = reps // 2 + (reps % 2 if block == 0 else 0)
    time_hf(hf, tokens)
    hf_s += [time_hf(hf, tokens) for _ in range(n)]
    time_rljax(model, tokens, seed=next(seeds))
    rl_s += [time_rljax(model, tokens, seed=next(seeds)) for _ in range(n)]
  n_tok = batch * NEW_TOKENS
  flops = generate_flops(cfg, batch, PROMPT_LEN, NEW_TOKENS)
  rl, peer = n_tok / statistics.median(rl_s), n_tok / statistics.median(hf_s)
  res = {
      "rljax": round(rl, 1), "peer": round(peer, 1), "ratio": round(rl / peer, 3),
      "rljax_min_max": [round(n_tok / max(rl_s)), round(n_tok / min(rl_s))],
      "peer_min_max": [round(n_tok / max(hf_s)), round(n_tok / min(hf_s))],
      "gflop_per_call": round(flops / 1e9, 2),
      "rljax_roofline_fraction": round(flops / statistics.median(rl_s) / 1e9 / peak_gflops, 4),
      "peer_roofline_fraction": round(flops / statistics.median(hf_s) / 1e9 / peak_gflops, 4),
      "rljax_compile_s": round(compile_s, 2),
  }
  if batch in PEER_REFERENCE:
    res["peer_reference"] = PEER_REFERENCE[batch]
    res["ratio_vs_reference"] = round(rl / PEER_REFERENCE[batch], 3)
  print(f"batch {batch:3d}: rljax {rl:8.0f} tok/s  HF {peer:8.0f} tok/s  ratio {rl / peer:5.2f}x"
        f"  | {flops / 1e9:.1f} GFLOP/call, rljax {res['rljax_roofline_fraction']:.1%} /"
        f" HF {res['peer_roofline_fraction']:.1%} of the matmul roofline"
        f"  | first call (compile) {compile_s:.1f} s", flush=True)
  return res


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--reps", type=int, default=7)
  parser.add_argument("--batches", default="64,8")
  parser.add_argument("--torch-threads", type=int, default=0, help="0: torch's default")
  args = parser.parse_args()
  if args.torch_threads:
    torch.set_num_threads(args.torch_threads)
  load_before = os.getloadavg()[0]
  batches = [int(b) for b in args.batches.split(",")]
  print(f"jax {jax.__version__} ({jax.devices()[0].platform}), torch {torch.__version__} "
        f"({torch.get_num_threads()} threads), transformers {transformers.__version__}")
  hf, model, cfg = build_models()
  peak = matmul_gflops()
  print(f"matmul roofline (1024³ fp32 jnp.dot): {peak:.1f} GFLOP/s")
  results = {b: run_batch(hf, model, cfg, b, args.reps, peak) for b in batches}
  first = batches[0]
  load = [round(load_before, 2), round(os.getloadavg()[0], 2)]
  print(f"load average (1 min) before / after: {load[0]} / {load[1]} on {os.cpu_count()} cores")
  summary = {"metric": f"tokens_per_s_batch{first}", **results[first],
             "matmul_gflops": round(peak, 1), "programs_compiled": compile_count(),
             "torch_threads": torch.get_num_threads(), "load_avg_before_after": load,
             "cpu_count": os.cpu_count()}
  for b in batches[1:]:
    summary.update({f"{k}_batch{b}": v for k, v in results[b].items()})
  print("RESULT " + json.dumps(summary))


if __name__ == "__main__":
  main()
