"""Peak memory per configuration of the trainer: the real update step and rollout forwards.

Compiles (never runs) `rljax.train.update.build_update_step`'s jitted step and the
rollout forward pass (`iteration.ForwardFns.policy_stats`: old / reference log-probs) for
each configuration and reads XLA's `compiled.memory_analysis()`: arguments, outputs,
temporaries, and the donated bytes outputs alias. Peak estimate of one program =
arguments + outputs + temporaries - aliased. The device total of a phase adds what stays
resident outside the program (optimizer state during a forward, a non-offloaded reference
model during everything); "device peak" is the larger of the update and forward phases.

  python benchmarks/memory.py [--vocab 32000 --batch 8 --seq 1024 --micro 4]
  python benchmarks/memory.py --scheduler concurrency   # XLA CPU's default scheduler
  python benchmarks/memory.py --reduced   # seconds: CI's run (`REDUCED_ARGS`, rows 0 and 3;
  #   vocab 128: the task tokenizer of experiments/grpo.py has 90 ids)

`--rss` adds a cross-check: the base row at a smaller size (`--rss-seq`) is run once in a
subprocess and the growth of its resident set during the step (polled /proc/self/statm,
large allocations forced to mmap so frees return to the OS) is compared with XLA's
estimate of the bytes the step allocates (temporaries + outputs - aliased).

The last line is `RESULT {"metric": "update_peak_bytes", "rljax": <remat + micro-batches>,
"peer": <baseline>, "ratio": ...}` (no external peer: the baseline is rljax without the
memory options).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys

from workload import rss_mb, scratch_dir

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
SCHEDULERS = {"memory": "false", "concurrency": "true"}
REDUCED_ARGS = dict(vocab=128, width=32, mlp=64, layers=2, heads=2, kv_heads=1, head_dim=16,
                    batch=4, seq=32, prompt=8, micro=2, rows="0,3")


def _set_scheduler(name):
  flag = f"--xla_cpu_enable_concurrency_optimized_scheduler={SCHEDULERS[name]}"
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flag).strip()


def _config(a, seq, **extra):
  from rljax.train.config import load_config
  over = {"model.vocab_size": a.vocab, "model.hidden_size": a.width,
          "model.intermediate_size": a.mlp, "model.num_layers": a.layers,
          "model.num_heads": a.heads, "model.num_kv_heads": a.kv_heads,
          "model.head_dim": a.head_dim, "model.max_position_embeddings": seq + 64,
          "sampling.max_new_tokens": seq - a.prompt, "sampling.prompts_per_iteration": 2,
          "sampling.n": a.batch // 2, "algo.minibatches": 1, "parallel.num_devices": 1,
          "sft.steps": 0, "run.dir": scratch_dir("rljax-mem-")}
  over.update(extra)
  return load_config(os.path.join(ROOT, "experiments", "grpo.py"), over)


def _nbytes(tree):
  import jax
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


def _built(config):
  """(run, fresh placed state, compiled iteration pieces): the trainer internals this
  benchmark needs, imported here only."""
  from rljax.train.run.build import build
  from rljax.train.run.iteration import make_trainer
  run = build(config)
  state = run.params.init_state(run.params.initial_actor)
  return run, state, make_trainer(run, state)


def _sequences(run, b):
  import jax
  import jax.numpy as jnp
  t, p = run.specs.rollout.max_new_tokens, run.ctx.prompt_len
  i32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.int32)  # noqa: E731
  return {"prompt_tokens": i32(b, p), "prompt_mask": i32(b, p), "tokens": i32(b, t),
          "mask": i32(b, t)}


def _minibatch(run, b):
  import jax
  import jax.numpy as jnp
  t = run.specs.rollout.max_new_tokens
  f32 = jax.ShapeDtypeStruct((b, t), jnp.float32)
  mb = _sequences(run, b)
  mb.update({k: f32 for k in ("old_logp", "ref_logp", "advantages", "returns", "old_values",
                              "token_weights", "is_weights")})
  mb["rng"] = jax.ShapeDtypeStruct((b, 2), jnp.uint32)
  mb["kl_coef"] = jax.ShapeDtypeStruct((), jnp.float32)
  return mb


def _stats(compiled):
  m = compiled.memory_analysis()
  out = {"args": m.argument_size_in_bytes, "out": m.output_size_in_bytes,
         "temp": m.temp_size_in_bytes, "alias": m.alias_size_in_bytes}
  out["peak"] = out["args"] + out["out"] + out["temp"] - out["alias"]
  return out


def _use_naive_logprobs(enabled):
  """Points the objective's log-prob call at one chunk of all T positions (the full
  [B,T,V] float32 logits and softmax at once, as a non-chunked trainer computes them),
  or back at the default chunking. The code has no config switch for the chunk size."""
  from rljax.models import logprobs
  from rljax.train.update import objective
  objective.token_logprobs_and_entropy = (
      functools.partial(logprobs.token_logprobs_and_entropy, chunk_size=1 << 30) if enabled
      else logprobs.token_logprobs_and_entropy)


def measure(a, row):
  """Memory of the update step and of the rollout forward for one configuration."""
  import jax.numpy as jnp

  from rljax.train.params.state import policy_params
  _use_naive_logprobs(row.get("naive", False))
  config = _config(a, a.seq, **row["config"])
  run, state, trainer = _built(config)
  with_ref = state.ref is not None or (state.base is not None
                                       and config.algo.kl_placement != "none")
  b = a.batch
  update = _stats(trainer.update_step.lower(state, _minibatch(run, b), jnp.asarray(True))
                  .compile())
  full = policy_params(state)   # LoRA: the base merged with the adapters
  forward = _stats(trainer.fns.policy_stats.lower(full, _sequences(run, b)).compile())
  params, opt = _nbytes(full), _nbytes(state.actor_opt)
  ref_dev = 0 if state.ref is None or config.algo.reference_offload else _nbytes(state.ref)
  ref_host = _nbytes(state.ref) if state.ref is not None and not ref_dev else 0
  phases = {"update": update["peak"] + ref_dev,
            "actor_forward": forward["peak"] + opt + ref_dev,
            # the reference forward: its params are arguments, the actor's stay resident
            "ref_forward": forward["peak"] + opt + params if with_ref else 0}
  if with_ref and state.base is not None:   # LoRA: the base is shared; zeroed adapters only
    phases["ref_forward"] = forward["peak"] + opt + _nbytes(state.actor)
  out = {"name": row["name"], "params": params, "opt": opt, "ref_device": ref_dev,
         "ref_host": ref_host, "update": update, "forward": forward, "phases": phases,
         "device_peak": max(phases.values()), "prompt_len": run.ctx.prompt_len,
         "completion_len": config.sampling.max_new_tokens, "trainable": _nbytes(state.actor)}
  if a.time:
    out["step_s"] = time_update(run, trainer, state, b, repeats=a.time)
  return out


def time_update(run, trainer, state, b, *, repeats):
  """Median wall seconds of the real update step on random inputs (after one warm-up)."""
  import time

  import jax
  import jax.numpy as jnp
  import numpy as np
  rng = np.random.default_rng(0)
  spec = _minibatch(run, b)
  mb = {k: jnp.asarray(rng.integers(3, 90, s.shape).astype(s.dtype) if s.dtype == jnp.int32
                       else rng.random(s.shape).astype(s.dtype)) for k, s in spec.items()}
  mb["mask"] = jnp.ones_like(mb["mask"])
  train = jnp.asarray(True)
  times = []
  for i in range(repeats + 1):
    t0 = time.perf_counter()
    state, metrics = trainer.update_step(state, mb, train)
    jax.block_until_ready((state, metrics))
    if i:
      times.append(time.perf_counter() - t0)
  return float(np.median(times))


def rows(a):
  kl = {"algo.kl_placement": "loss", "algo.kl_coef": 0.05}
  both = {"model.remat": True, "algo.microbatches": a.micro}
  lora = {"model.lora_rank": 8, "model.lora_alpha": 32.0}
  return [
      {"name": "baseline (no remat, 1 micro-batch, chunked log-probs)", "config": {}},
      {"name": "+ remat", "config": {"model.remat": True}},
      {"name": f"+ {a.micro} micro-batches", "config": {"algo.microbatches": a.micro}},
      {"name": f"+ remat + {a.micro} micro-batches", "config": both},
      {"name": "naive log-probs (one chunk of T)", "config": {}, "naive": True},
      {"name": "+ reference model (KL in loss)", "config": kl},
      {"name": "+ reference model, offloaded", "config": dict(kl, **{
          "algo.reference_offload": True})},
      {"name": "bf16 params + compute", "config": {"model.param_dtype": "bfloat16",
                                                   "model.dtype": "bfloat16"}},
      {"name": f"all: remat + {a.micro} micro + offloaded ref + bf16", "config": dict(
          both, **kl, **{"algo.reference_offload": True, "model.param_dtype": "bfloat16",
                         "model.dtype": "bfloat16"})},
      {"name": "LoRA r=8, all 7 projections", "config": lora},
      {"name": "LoRA r=8 + reference (= base, adapters off; KL in loss)", "config": dict(
          lora, **kl)},
      {"name": f"LoRA r=8 + remat + {a.micro} micro-batches", "config": dict(lora, **both)},
      {"name": "LoRA r=8, bf16 base (fp32 adapters)", "config": dict(lora, **{
          "model.param_dtype": "bfloat16", "model.dtype": "bfloat16"})},
  ]


def _mb(x):
  return f"{x / 2**20:,.0f}"


def table(results):
  head = ("| configuration | params + opt MB (fixed) | trainable MB | ref on device / host MB | "
          "update args | update out | update temp | update peak MB | forward temp | "
          "forward peak MB | device peak MB | update step s |")
  lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
  for r in results:
    u, f = r["update"], r["forward"]
    step = f"{r['step_s']:.2f}" if "step_s" in r else "–"
    lines.append(
        f"| {r['name']} | {_mb(r['params'] + r['opt'])} | {r['trainable'] / 2**20:,.2f} | "
        f"{_mb(r['ref_device'])} / {_mb(r['ref_host'])} | {_mb(u['args'])} | {_mb(u['out'])} | "
        f"{_mb(u['temp'])} | **{_mb(u['peak'])}** | {_mb(f['temp'])} | {_mb(f['peak'])} | "
        f"**{_mb(r['device_peak'])}** | {step} |")
  return "\n".join(lines)


def _rss_child(a):
  """In a subprocess: run the base update step once; RSS growth during it vs XLA's estimate."""
  import threading
  import time

  import jax
  import jax.numpy as jnp
  import numpy as np

  run, state, trainer = _built(_config(a, a.rss_seq))
  spec = _minibatch(run, a.batch)
  rng = np.random.default_rng(0)
  mb = {k: jnp.asarray(rng.integers(3, 90, s.shape).astype(s.dtype) if s.dtype == jnp.int32
                       else rng.random(s.shape).astype(s.dtype)) for k, s in spec.items()}
  mb["mask"] = jnp.ones_like(mb["mask"])
  train = jnp.asarray(True)
  compiled = trainer.update_step.lower(state, mb, train).compile()
  est = _stats(compiled)
  jax.block_until_ready((state, mb))
  rss = lambda: round(rss_mb() * 2 ** 20)  # noqa: E731   (bytes, as XLA's figures)
  before, peak, done = rss(), [0], threading.Event()

  def poll():
    while not done.is_set():
      peak[0] = max(peak[0], rss())
      time.sleep(0.0005)
  thread = threading.Thread(target=poll)
  thread.start()
  new_state, _ = trainer.update_step(state, mb, train)
  jax.block_until_ready(new_state)
  done.set()
  thread.join()
  expected = est["temp"] + est["out"] - est["alias"]
  print("RSS " + json.dumps({"rss_growth": peak[0] - before, "xla_allocated": expected,
                             "xla": est, "seq": a.rss_seq}))


def rss_check(a):
  env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", PYTHONPATH=ROOT)
  argv = [sys.executable, os.path.abspath(__file__), "--rss-child", *sys.argv[1:]]
  out = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=ROOT)
  if out.returncode:
    raise RuntimeError(out.stderr[-3000:])
  return json.loads(out.stdout.split("RSS ")[-1])


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--vocab", type=int, default=32_000)
  ap.add_argument("--width", type=int, default=256)
  ap.add_argument("--mlp", type=int, default=768)
  ap.add_argument("--layers", type=int, default=4)
  ap.add_argument("--heads", type=int, default=4)
  ap.add_argument("--kv-heads", type=int, default=2)
  ap.add_argument("--head-dim", type=int, default=64)
  ap.add_argument("--batch", type=int, default=8, help="sequences per update step")
  ap.add_argument("--seq", type=int, default=1024, help="prompt + completion tokens")
  ap.add_argument("--prompt", type=int, default=16, help="prompt tokens (the task's bucket)")
  ap.add_argument("--micro", type=int, default=4)
  ap.add_argument("--scheduler", choices=list(SCHEDULERS), default="memory")
  ap.add_argument("--rows", default="", help="comma-separated row indices (default: all)")
  ap.add_argument("--rss", action="store_true", help="cross-check against process RSS")
  ap.add_argument("--time", type=int, default=0, metavar="N",
                  help="also run each row's update step N times (after a warm-up): median s")
  ap.add_argument("--rss-seq", type=int, default=512)
  ap.add_argument("--reduced", action="store_true",
                  help="seconds: `REDUCED_ARGS`, the baseline and remat + micro-batch rows")
  ap.add_argument("--rss-child", action="store_true", help=argparse.SUPPRESS)
  a = ap.parse_args()
  if a.reduced:
    vars(a).update(REDUCED_ARGS)
  _set_scheduler(a.scheduler)
  sys.path.insert(0, ROOT)
  if a.rss_child:
    return _rss_child(a)
  chosen = rows(a)
  if a.rows:
    chosen = [chosen[int(i)] for i in a.rows.split(",")]
  results = []
  for row in chosen:
    results.append(measure(a, row))
    print(f"# {row['name']}: update peak {_mb(results[-1]['update']['peak'])} MB", flush=True)
  r0 = results[0]
  print(f"\nV={a.vocab} D={a.width} MLP={a.mlp} L={a.layers} H={a.heads}x{a.head_dim} "
        f"KV={a.kv_heads}; {a.batch} sequences x ({r0['prompt_len']} prompt + "
        f"{r0['completion_len']} completion) tokens; fp32 unless stated; XLA CPU "
        f"{a.scheduler} scheduler; MB = 2^20 bytes\n")
  print(table(results))
  extra = {}
  if a.rss:
    check = rss_check(a)
    extra = {"rss_check": check}
    print(f"\nRSS cross-check (baseline row, seq {a.rss_seq}): resident set grew by "
          f"{_mb(check['rss_growth'])} MB during the step; XLA's estimate of what it "
          f"allocates (temp + outputs - aliased) is {_mb(check['xla_allocated'])} MB "
          f"(ratio {check['rss_growth'] / check['xla_allocated']:.2f})")
  base = results[0]["update"]["peak"]
  best = next((r for r in results if r["name"].startswith("+ remat + ")), results[-1])
  print("RESULT " + json.dumps({"metric": "update_peak_bytes", "rljax": best["update"]["peak"],
                                "peer": base, "ratio": round(base / best["update"]["peak"], 4),
                                "rljax_row": best["name"], "peer_row": results[0]["name"],
                                "rows": [{"name": r["name"], "update": r["update"],
                                          "device_peak": r["device_peak"]} for r in results],
                                "shape": {k: getattr(a, k) for k in REDUCED_ARGS if k != "rows"},
                                "reduced": a.reduced, **extra}))


if __name__ == "__main__":
  main()
