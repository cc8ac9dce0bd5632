"""rljax at Qwen2.5-0.5B's shapes against its peers: sampler, GRPO step, update roofline, memory.

Model: the Qwen2 architecture at Qwen2.5-0.5B's shapes (24 layers, width 896, 14 query
heads and 2 KV heads of 64, MLP 4,864, vocab 151,936, tied embeddings, rope θ 1e6, q/k/v
biases), random weights built with `transformers` from a fixed seed, saved with
`save_pretrained` (safetensors) and loaded into rljax with `rljax.models.load_hf`; float32
throughout. Every shape has a flag, so the same script runs at a reduced size (the CI test
`tests/test_benchmarks_real_shapes.py`).

Measured, each side in its own worker process pinned to the same CPUs (XLA sizes its
thread pool from the affinity; torch gets `set_num_threads`), the configurations of the
two sides printed and checked field by field (exit status 2 naming the field if they
differ):

  (a) sampler: `rljax.sampling.generate` (static batch) and the trainer's default
      continuous-batching sampler (`generate_continuous`, every row resident) vs
      `transformers` `generate`, `--batch` prompts x `--new-tokens` sampled tokens (no
      early stop), temperature 1, no top-k / top-p. Each sampler in its own worker;
      calls alternate between the workers, one at a time.
  (b) one GRPO step (generation + update) vs TRL's `GRPOTrainer`:
      `--grpo-prompts` x `--group` completions of `--new-tokens` tokens, through
      `benchmarks/grpo_vs_trl.py`'s workers and checks (same loss, clipping, optimizer,
      float32, one update per rollout, no activation checkpointing), one side after the
      other (two resident 0.5B trainers would not fit in memory).
  (c) the update step's achieved FLOP/s (analytic FLOPs as `benchmarks/update_roofline.py`
      counts them) against the sustained 1024³ fp32 `jnp.dot` rate measured right before
      each GRPO step in the same process.
  (d) peak memory: each worker's resident-set high-water mark (`ru_maxrss`; each rljax
      sampler, HF's sampler and each GRPO side run in separate processes), and XLA's compiled memory
      analysis of the update step (arguments + outputs + temporaries - donated).

Each comparison prints one line `RESULT {"metric", "rljax", "peer", "ratio", ...}`: for
(a) and (b) seconds, ratio = peer time / rljax time (> 1: rljax is faster); for (c)
`update_roofline_fraction`, rljax = update GFLOP/s, peer = roofline GFLOP/s, ratio =
their quotient; for (d) MB, ratio = peer / rljax. Medians over `--reps` calls after
`--warmup` untimed ones, with min-max; each line carries the load average when printed.

    python benchmarks/real_shapes.py [--reps 5] [--parts sampler,grpo] [--peers hf,trl]
        [--host-memory huge-pages|keep-freed|glibc]
    python benchmarks/real_shapes.py --reduced --peers hf   # seconds: CI's run

`--reduced` sets the shape flags to `workload.REDUCED_HF_CONFIG`'s (2 layers, width 32,
vocab 64), 8 + 8 tokens, batch 4, GRPO 2 x 2, 2 timed calls after 1; it measures nothing.

The full size needs ~10 GB per GRPO worker (fp32 parameters, gradients and AdamW moments
of 494 M parameters, activations); the two run one after the other.
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
  emit,
  print_configs,
  run_pair,
  summarise,
  wait_command,
)
from workload import REDUCED, REDUCED_HF_CONFIG, pin_cpus, prompt_ids, rss_peak_mb, sig

QWEN25_05B = dict(layers=24, width=896, heads=14, kv_heads=2, head_dim=64, intermediate=4864,
                  vocab=151936)
_R = REDUCED_HF_CONFIG
REDUCED_ARGS = dict(layers=_R["num_hidden_layers"], width=_R["hidden_size"],
                    heads=_R["num_attention_heads"], kv_heads=_R["num_key_value_heads"],
                    head_dim=_R["head_dim"], intermediate=_R["intermediate_size"],
                    vocab=_R["vocab_size"], prompt_len=REDUCED["prompt_len"],
                    new_tokens=REDUCED["new_tokens"], batch=4, grpo_prompts=REDUCED["prompts"],
                    group=REDUCED["group"], reps=2, warmup=1)
SAMPLERS = ("static", "continuous")   # rljax's, each in its own worker
SAMPLER_COMPARED = ("dtype", "threads", "batch", "prompt_len", "new_tokens", "stop_tokens",
                    "temperature", "top_k", "top_p")


def hf_config(a: dict) -> dict:
  """transformers.Qwen2Config kwargs for the shape dict `a` (Qwen2.5-0.5B's other fields)."""
  return dict(vocab_size=a["vocab"], hidden_size=a["width"], intermediate_size=a["intermediate"],
              num_hidden_layers=a["layers"], num_attention_heads=a["heads"],
              num_key_value_heads=a["kv_heads"], head_dim=a["head_dim"],
              max_position_embeddings=32768, rope_theta=1e6, rms_norm_eps=1e-6,
              tie_word_embeddings=True, use_sliding_window=False)


# ----------------------------------------------------------------------------- workers
def save_worker(spec: dict) -> None:
  """Builds the seeded random-weight model with transformers and saves it (safetensors)."""
  import torch
  import transformers

  torch.manual_seed(0)
  model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**spec["hf_config"]))
  model.save_pretrained(spec["model_dir"])
  emit("SAVED", {"parameters": sum(p.numel() for p in model.parameters())})


def sampler_config(threads: int, spec: dict, dtype: str) -> dict:
  return {"dtype": dtype, "threads": threads, "batch": spec["batch"],
          "prompt_len": spec["prompt_len"], "new_tokens": spec["new_tokens"],
          "stop_tokens": [], "temperature": 1.0, "top_k": 0, "top_p": 1.0}


def rljax_sampler_worker(spec: dict) -> None:
  """One call of each rljax sampler per "step" command: {"static": s, "continuous": s}
  (`spec["variants"]`: only those)."""
  cpus = pin_cpus(spec["threads"])
  import jax
  from flax import nnx

  from rljax.models import abstract_hf, load_hf
  from rljax.sampling import SamplingParams, compile_count, generate, precompile
  from rljax.sampling.continuous import generate_continuous

  abstract, cfg = abstract_hf(spec["model_dir"])
  tokens = prompt_ids(1, cfg.vocab_size, seed=1, prompts=spec["batch"],
                      prompt_len=spec["prompt_len"])[0]
  mask = np.ones_like(tokens)
  sampling = SamplingParams(max_new_tokens=spec["new_tokens"], temperature=1.0)
  b, t = spec["batch"], spec["new_tokens"]

  def static(model, seed):
    return generate(model, tokens, mask, sampling=sampling, rng=jax.random.key(seed))

  def continuous(model, seed):   # the trainer's default: every row resident (slots = rows)
    return generate_continuous(model, tokens, mask, sampling=sampling, rng=jax.random.key(seed),
                               slots=b, share_prefill=True)

  variants = {"static": static, "continuous": continuous}
  variants = {k: v for k, v in variants.items() if k in spec.get("variants", variants)}
  ahead = spec.get("sampler_compile", "ahead") == "ahead"
  t0 = time.perf_counter()
  for fn in variants.values() if ahead else ():   # before the weights are resident
    precompile(fn, abstract, 0)
  compile_s = time.perf_counter() - t0
  model, _ = load_hf(spec["model_dir"])
  compiled = compile_count()

  def call(name, seed):
    t0 = time.perf_counter()
    out = variants[name](model, seed)
    out.tokens.block_until_ready()
    dt = time.perf_counter() - t0
    assert int(out.mask.sum()) == b * t, "a row stopped early"
    return dt

  config = {**sampler_config(len(os.sched_getaffinity(0)), spec,
                            f"{cfg.dtype} compute, {cfg.param_dtype} params"),
            "cpus": cpus, "variants": list(variants), "xla_cpu_devices": len(jax.devices()),
            "jax_platforms": os.environ.get("JAX_PLATFORMS", "(unset)"),
            "sampler_compile": "ahead" if ahead else "first-call"}
  if spec.get("probe"):   # the loaded weights, for a peer to compare (vs_tunix.py)
    config["logits_probe"] = logits_probe(model, tokens)
  emit("CONFIG", config)
  first = {name: call(name, 0) for name in variants}   # compiles
  for i in range(spec["warmup"] - 1):
    for name in variants:
      call(name, 1 + i)
  emit("READY", {})
  i = 0
  while wait_command() == "step":
    order = list(variants) if i % 2 == 0 else list(variants)[::-1]
    emit("STEP", {name: call(name, 100 + i) for name in order})
    i += 1
  param_bytes = sum(x.nbytes for x in jax.tree.leaves(nnx.state(model)))
  # compiled ahead: the calls compiled nothing (the same program, `rljax.sampling.precompile`)
  assert not ahead or compile_count() == compiled, "a call compiled again"
  emit("DONE", {"rss_peak_mb": round(rss_peak_mb(), 1), "first_call_s": first,
                "precompile_s": round(compile_s, 1), "param_mb": round(param_bytes / 2 ** 20, 1)})


def logits_probe(model, tokens: np.ndarray, rows: int = 2, vocab: int = 16) -> list:
  """Teacher-forced logits of the first `rows` prompts at their last position, the first
  `vocab` entries: the same numbers from two loaders mean the same weights."""
  import jax.numpy as jnp

  t = jnp.asarray(tokens[:rows])
  positions = jnp.broadcast_to(jnp.arange(t.shape[1]), t.shape)
  logits = model(t, positions=positions, attention_mask=jnp.ones(t.shape, jnp.int32))
  return np.asarray(logits[:, -1, :vocab], np.float64).tolist()


def hf_sampler_worker(spec: dict) -> None:
  """One `transformers` `generate` call per "step" command: {"hf": s}."""
  cpus = pin_cpus(spec["threads"])
  import torch
  import transformers

  torch.set_num_threads(len(cpus))
  model = transformers.AutoModelForCausalLM.from_pretrained(spec["model_dir"],
                                                            dtype=torch.float32).eval()
  vocab = model.config.vocab_size
  ids = torch.tensor(prompt_ids(1, vocab, seed=1, prompts=spec["batch"],
                                prompt_len=spec["prompt_len"])[0])
  b, t = spec["batch"], spec["new_tokens"]

  def call():
    with torch.inference_mode():
      t0 = time.perf_counter()
      out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True,
                           temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=t,
                           min_new_tokens=t, eos_token_id=None, pad_token_id=0)
      dt = time.perf_counter() - t0
    assert out.shape == (b, spec["prompt_len"] + t), out.shape
    return dt

  dtypes = sorted({str(p.dtype).split(".")[1] for p in model.parameters()})
  emit("CONFIG", {**sampler_config(torch.get_num_threads(), spec,
                                   f"float32 compute, {'/'.join(dtypes)} params"),
                  "cpus": cpus, "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "(unset)"),
                  "transformers": transformers.__version__})
  first = call()
  for _ in range(spec["warmup"] - 1):
    call()
  emit("READY", {})
  while wait_command() == "step":
    emit("STEP", {"hf": call()})
  emit("DONE", {"rss_peak_mb": round(rss_peak_mb(), 1), "first_call_s": {"hf": first}})


# ----------------------------------------------------------------------------- parent
def result(metric: str, rljax, peer, ratio=None, **extra) -> dict:
  """A RESULT line (printed) and its dict; ratio defaults to peer / rljax (None without a
  peer); the 1-minute load average at the time is added."""
  if ratio is None and peer is not None and rljax:
    ratio = sig(peer / rljax)
  res = {"metric": metric, "rljax": rljax, "peer": peer, "ratio": ratio, **extra,
         "loadavg": round(os.getloadavg()[0], 2)}
  print("RESULT " + json.dumps(res), flush=True)
  return res


def min_max(xs) -> list[float]:
  return [sig(min(xs)), sig(max(xs))]


def run_sampler(model_dir: str, args, shape: dict) -> list[dict]:
  """(a) and its part of (d): the rljax samplers and HF generate, calls alternating."""
  spec = {"model_dir": model_dir, "batch": args.batch, "prompt_len": args.prompt_len,
          "new_tokens": args.new_tokens, "threads": args.threads, "warmup": args.warmup,
          "host_memory": args.host_memory, "sampler_compile": args.sampler_compile}
  # one process per sampler (HF's is its own too), so that each peak RSS is that sampler's alone
  sides = list(SAMPLERS) + (["hf"] if "hf" in args.peers else [])
  workers = {}
  try:
    for name in sides:
      kind = "hf" if name == "hf" else "rljax"
      workers[name] = Worker(kind + "_sampler", {**spec, "variants": [name]},
                             args.omp_wait_policy, script=__file__)
    for name in SAMPLERS:
      configs = {"rljax": workers[name].config}
      if "hf" in workers:
        configs["hf"] = workers["hf"].config
      print_configs(configs, SAMPLER_COMPARED)
      if len(configs) == 2:
        check_configs(configs, SAMPLER_COMPARED, "sampler configuration")
    for w in workers.values():   # a warm-up beside a timed call slowed it (0.5B: 18.5 vs 7.2 s)
      w.wait_ready()
    times: dict[str, list[float]] = {}
    for i in range(args.reps):
      for name in (sides if i % 2 == 0 else sides[::-1]):
        for k, v in workers[name].step().items():
          times.setdefault(k, []).append(v)
      print(f"  sampler call {i + 1}: " + ", ".join(f"{k} {v[-1]:.2f}s" for k, v in times.items()),
            flush=True)
    done = {s: w.close() for s, w in workers.items()}
  finally:
    for w in workers.values():
      w.kill()
  tokens = args.batch * args.new_tokens
  peer = statistics.median(times["hf"]) if "hf" in times else None
  out = []
  for name in SAMPLERS:
    rl = statistics.median(times[name])
    out.append(result(
        f"sampler_seconds_{name}", sig(rl), peer and sig(peer),
        rljax_tokens_per_s=round(tokens / rl, 1),
        peer_tokens_per_s=peer and round(tokens / peer, 1),
        rljax_min_max=min_max(times[name]), peer_min_max=peer and min_max(times["hf"]),
        # each decode step streams every parameter once: bytes / time is the bandwidth bound
        rljax_weight_gb_per_s=round(done[name]["param_mb"] * 2 ** 20 * args.new_tokens
                                    / rl / 1e9, 2),
        rljax_first_call_s=round(done[name]["first_call_s"][name], 1),
        rljax_precompile_s=done[name]["precompile_s"], sampler_compile=args.sampler_compile,
        batch=args.batch, prompt_len=args.prompt_len, new_tokens=args.new_tokens,
        shape=shape, reps=args.reps, threads=configs["rljax"]["threads"]))
  for name in SAMPLERS:
    out.append(result(f"sampler_peak_rss_mb_{name}", done[name]["rss_peak_mb"],
                      done["hf"]["rss_peak_mb"] if "hf" in done else None,
                      rljax_param_mb=done[name]["param_mb"],
                      note="resident-set high-water mark of each sampler's worker process "
                           "(one per sampler); ratio = HF / rljax"))
  return out


def run_grpo(model_dir: str, args, shape: dict) -> list[dict]:
  """(b), (c) and their part of (d), through grpo_vs_trl's workers and checks."""
  spec = {"model_dir": model_dir, "prompts": args.grpo_prompts, "group": args.group,
          "prompt_len": args.prompt_len, "new_tokens": args.new_tokens, "stop_tokens": [],
          "pack": False, "loss_agg": "seq_mean_token_mean", "lr": 1e-5,
          "threads": args.threads, "steps": args.warmup + args.reps, "time_recompute": False,
          "roofline": True, "vocab": shape["vocab"], "trl_overrides": {},
          "host_memory": args.host_memory}
  sides = ("rljax", "trl") if "trl" in args.peers else ("rljax",)
  runs = run_pair(spec, schedule="sequential", omp_wait_policy=args.omp_wait_policy,
                  sides=sides)
  med = summarise(runs, args.warmup)
  rl, peer = med["rljax"], med.get("trl")
  steps = runs["rljax"]["steps"][args.warmup:]
  done = runs["rljax"]["done"]
  out = [result(
      "grpo_step_seconds", sig(rl["total"]), peer and sig(peer["total"]),
      rljax_generate=sig(rl["generate"]), rljax_update=sig(rl["update"]),
      peer_generate=peer and sig(peer["generate"]), peer_train=peer and sig(peer["train"]),
      rljax_min_max=rl["min_max"], peer_min_max=peer and peer["min_max"],
      # CPU seconds per step (all threads): much less sensitive to other jobs than wall time
      rljax_cpu_s=round(rl["cpu_s"], 2), peer_cpu_s=peer and round(peer["cpu_s"], 2),
      completions=args.grpo_prompts * args.group, new_tokens=args.new_tokens, shape=shape,
      reps=args.reps, threads=runs["rljax"]["config"]["threads"])]
  roof = statistics.median(s["roofline_gflops"] for s in steps)
  achieved = done["update_gflop"] / rl["update"]
  out.append(result(
      "update_roofline_fraction", sig(achieved), sig(roof),
      ratio=sig(achieved / roof),   # update GFLOP/s / roofline GFLOP/s
      update_gflop=sig(done["update_gflop"]), update_seconds=sig(rl["update"]),
      paired_fraction=round(statistics.median(s["update_gflops"] / s["roofline_gflops"]
                                              for s in steps), 4),
      roofline_min_max=min_max([s["roofline_gflops"] for s in steps]),
      update_compiles=done["update_compiles"]))
  out.append(result("grpo_peak_rss_mb", done["rss_peak_mb"],
                    runs["trl"]["done"]["rss_peak_mb"] if "trl" in runs else None,
                    rljax_xla_update=done["xla_update"],
                    note="resident-set high-water mark of each GRPO worker process; "
                         "rljax_xla_update: XLA's compiled memory analysis of the update step"))
  return out


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  for name, default in QWEN25_05B.items():
    parser.add_argument("--" + name.replace("_", "-"), type=int, default=default)
  parser.add_argument("--prompt-len", type=int, default=64)
  parser.add_argument("--new-tokens", type=int, default=128)
  parser.add_argument("--batch", type=int, default=8, help="sampler prompts (one sample each)")
  parser.add_argument("--grpo-prompts", type=int, default=1)
  parser.add_argument("--group", type=int, default=8, help="GRPO samples per prompt")
  parser.add_argument("--reps", type=int, default=5)
  parser.add_argument("--warmup", type=int, default=1, help="untimed calls / steps per side")
  parser.add_argument("--parts", default="sampler,grpo")
  parser.add_argument("--host-memory", choices=HOST_MEMORY, default="huge-pages",
                      help="every worker's allocator (grpo_vs_trl.py --host-memory); "
                           "keep-freed costs memory at these shapes")
  parser.add_argument("--sampler-compile", choices=["ahead", "first-call"], default="ahead",
                      help="rljax's sampler programs: compiled from the abstract model before "
                           "the weights are loaded (`rljax.sampling.precompile`), or by the "
                           "first call")
  parser.add_argument("--peers", default="hf,trl", help="comma list of hf, trl ('' for none)")
  parser.add_argument("--threads", type=int, default=0, help="CPUs per side (0: all)")
  parser.add_argument("--omp-wait-policy", default="passive",
                      choices=["passive", "active", "default"])
  parser.add_argument("--model-dir", default="",
                      help="reuse (or keep) the saved random-weight model in this directory")
  parser.add_argument("--reduced", action="store_true",
                      help="seconds: every shape flag set to `REDUCED_ARGS` (CI's run)")
  parser.add_argument("--worker", help=argparse.SUPPRESS)
  parser.add_argument("--spec", help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.reduced:
    vars(args).update(REDUCED_ARGS)
  if args.worker:
    workers = {"save": save_worker, "rljax_sampler": rljax_sampler_worker,
               "hf_sampler": hf_sampler_worker}
    workers[args.worker](json.loads(args.spec))
    return
  if args.warmup < 1:
    parser.error("--warmup must be >= 1 (the first call compiles)")
  args.peers = [p for p in args.peers.split(",") if p]
  shape = {k: getattr(args, k) for k in QWEN25_05B}
  load_before = os.getloadavg()
  print(f"shape {shape}; load average {load_before[0]:.2f} on {os.cpu_count()} cores; host "
        f"memory {args.host_memory} (every worker)", flush=True)
  with tempfile.TemporaryDirectory() as tmp:
    model_dir = args.model_dir or tmp
    if not os.path.exists(os.path.join(model_dir, "config.json")):
      t0 = time.perf_counter()
      spec = {"model_dir": model_dir, "hf_config": hf_config(shape)}
      proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", "save",
                             "--spec", json.dumps(spec)], capture_output=True, text=True)
      saved = [x for x in proc.stdout.splitlines() if x.startswith("SAVED ")]
      if proc.returncode or not saved:
        raise SystemExit(f"saving the model failed:\n{proc.stderr[-2000:]}")
      n = json.loads(saved[0][6:])["parameters"]
      print(f"saved {n / 1e6:.1f} M parameters in {time.perf_counter() - t0:.0f} s", flush=True)
    results = []
    if "sampler" in args.parts:
      results += run_sampler(model_dir, args, shape)
    if "grpo" in args.parts:
      results += run_grpo(model_dir, args, shape)
  print(f"load average (1 min) before / after: {load_before[0]:.2f} / "
        f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")


if __name__ == "__main__":
  main()
