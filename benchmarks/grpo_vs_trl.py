"""One GRPO iteration: rljax vs TRL `GRPOTrainer`, each in its own process, same work checked.

Workload (default, the shared tiny one): Qwen2 layout, vocab 512, width 256, MLP 768, 4
layers, 4 query heads x 64, 2 KV heads, untied lm head, rope θ 1e4, random weights built
with torch from a fixed seed and saved once with `save_pretrained`; rljax loads them with
`rljax.models.load_hf`, TRL with `from_pretrained`. One step = 8 prompts of 32 tokens x 8
generations = 64 completions of exactly 96 tokens (no early stop), random rewards, GRPO
advantages (group mean and std), one AdamW update (lr 1e-5, grad-norm clip 1.0), no
reference model (beta 0). TRL sees the same prompt ids as strings of space-separated words
over a `WordLevel` tokenizer. `benchmarks/real_shapes.py` runs the same pair at
Qwen2.5-0.5B's shapes.

A fair comparison, checked. Each side runs in its own worker process (this script with
`--worker rljax|trl`), pinned to the same CPUs (`--threads N`, default all of them): XLA
sizes its thread pool from the CPU affinity, torch gets `set_num_threads(N)`; the rljax
worker runs one XLA CPU device per CPU (`JAX_NUM_CPU_DEVICES`; `--rljax-devices`;
`workload.rljax_cpu_devices`: 64 rows on 2 CPUs), the rows of the rollout and of the update
data-parallel over them (gradients all-reduced), where torch splits every op over its
threads. Both
workers report their configuration as measured from their own objects (TRL's
`GRPOConfig` after its defaults are resolved, the model's parameter dtype, torch's thread
count; rljax's trainer config, model dtype and CPU set), in one vocabulary (`COMPARED`):
dtype (float32), threads, prompts, samples per prompt, prompt and completion lengths, loss
aggregation (rljax `seq_mean_token_mean` = TRL `loss_type="grpo"`), clip range, KL
coefficient, optimizer, updates per rollout, activation checkpointing, sampling filters.
The script prints both and exits with status 2, naming the field, when they differ —
before any step is timed; after the run it checks what each side observed (completion
tokens per step, optimizer steps taken) the same way.

Why (measured, `benchmarks/README.md`): TRL's step time on this shared 2-core machine
swung between 0.76 s and 48.7 s per train phase across sessions. The cause is torch's
OpenMP threads spin-waiting at every parallel region's barrier when another process holds
one of the two cores; `OMP_WAIT_POLICY=PASSIVE` (default here, `--omp-wait-policy`) makes
waiting threads sleep instead. `GRPOConfig`'s defaults (bf16 autocast, gradient
checkpointing) are turned off so both sides do the same float32 work.

rljax runs the trainer's pieces exactly as `rljax.train.iteration.rl_iteration` does with
`algo.old_logp_source="update"` (one update per rollout, as TRL here: neither side runs a
separate old-log-prob forward): continuous-batching rollout with every row resident and
one prefill per prompt (`sampling.continuous`, `share_prefill`) -> host rows ->
advantages -> one jitted `update_step`. TRL is timed with a trainer callback (step begin
-> step end, optimizer step included) around a wrapper of `_generate_and_score_completions`
(generation + reward + advantages); `train = step - generate`.

Host memory: both workers run with the allocator the `rljax` command uses
(`--host-memory huge-pages`, the default: glibc's `glibc.malloc.hugetlb=1` tunable, so XLA's
per-call temporaries are faulted in as 2 MB pages instead of 4 KB ones;
`rljax.host_memory.huge_pages_environ`), or `keep-freed` (RLJAX_KEEP_FREED_MEMORY=1: blocks
of at most 16 MB that glibc keeps for the next call; its `mallopt` part applies to TRL's
worker too), or `glibc` (glibc's defaults). Each side reports CPU seconds, kernel seconds
and page faults per step.

Steps alternate between the two workers (`--schedule alternate`, order flipped every
step) so both see the same moments of the shared machine; `sequential` runs one side's
steps, then the other's (`real_shapes.py` at 0.5B, where two resident trainers would not
fit in memory).

    python benchmarks/grpo_vs_trl.py [--reps 6] [--warmup 2] [--threads N] [--rljax-devices N]
        [--omp-wait-policy passive|active|default] [--schedule alternate|sequential]
        [--longtail] [--time-recompute] [--host-memory huge-pages|keep-freed|glibc] [--peer trl|none]
    python benchmarks/grpo_vs_trl.py --reduced [--peer none]   # seconds: CI's run

`--longtail`: completions stop at any of 10 of the 512 ids, up to 256 tokens (near-uniform
random model: geometric lengths, mean ~45); rljax's update runs on packed rows
(`algo.pack_sequences`), TRL pads to the longest. `--time-recompute` also times rljax's
separate old-log-prob forward (`algo.old_logp_source="recompute"`), outside the step.
`--reduced`: `workload.REDUCED_HF_CONFIG` and `workload.REDUCED` shapes (2 prompts x 2
samples of 8 + 8 tokens), 2 timed steps after 1 (CI runs it; it measures nothing);
`--peer none` runs the rljax worker alone (no TRL installed), its RESULT `peer` null.

Last line: RESULT {"metric": "grpo_step_seconds", "rljax": ..., "peer": ..., "ratio": ...}
with ratio = peer / rljax (> 1: rljax is faster), medians over the timed steps.
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
from workload import (
  GROUP,
  LR,
  NEW_TOKENS,
  PROMPT_LEN,
  PROMPTS,
  REDUCED,
  RljaxGRPO,
  hf_config,
  matmul_roofline,
  pin_cpus,
  process_threads,
  process_usage,
  prompt_ids,
  rljax_cpu_devices,
  rss_peak_mb,
  save_hf,
  scratch_dir,
  sig,
  usage_since,
  word_tokenizer,
)

from rljax.host_memory import ENV as HOST_MEMORY_ENV
from rljax.host_memory import HEAP_FLAG, HUGE_PAGES_TUNABLE, huge_pages_environ

# --host-memory: every worker's allocator, the same on both sides. huge-pages: what the
# `rljax` command runs with (`rljax.host_memory.huge_pages_environ`); keep-freed:
# RLJAX_KEEP_FREED_MEMORY=1; glibc: glibc's defaults.
HOST_MEMORY = ("huge-pages", "keep-freed", "glibc")

# --longtail: up to 256 new tokens, stopping at any of 10 of the 512 ids; the random model's
# next-token distribution is near uniform, so lengths are geometric (mean ~45, max ~256)
LONGTAIL_TOKENS, LONGTAIL_STOPS = 256, tuple(range(2, 12))
# rljax aggregation mode -> TRL loss_type with the same normaliser (one process, no
# gradient accumulation): GRPO's per-sequence token mean, DAPO's token mean, Dr.GRPO's
# constant max-length normaliser
TRL_LOSS = {"seq_mean_token_mean": "grpo", "token_mean": "dapo",
            "seq_mean_token_sum_norm": "dr_grpo"}
# Fields both workers must report with equal values before anything is timed.
COMPARED = ("dtype", "threads", "prompts", "group", "completions", "prompt_len",
            "new_tokens", "stop_tokens", "loss_agg", "eps_low", "eps_high", "kl_coef",
            "advantage", "updates_per_rollout", "micro_batches", "optimizer", "lr",
            "adam_b1", "adam_b2", "adam_eps", "weight_decay", "grad_clip",
            "activation_checkpointing", "old_logp_forward", "temperature", "top_p", "top_k",
            "freed_host_memory")
# ... and after the run, what each side observed per step
OBSERVED = ("completion_tokens_per_step", "optimizer_steps")


# ----------------------------------------------------------------------------- workers
def emit(tag: str, payload) -> None:
  """One protocol line on stdout: `TAG {json}`."""
  print(f"{tag} {json.dumps(payload)}", flush=True)


def wait_command() -> str:
  """The parent's next command ("step" or "done") from stdin."""
  return sys.stdin.readline().strip() or "done"


def host_memory() -> str:
  """This worker's allocator: XLA's temporaries in blocks glibc keeps for reuse
  (`rljax.host_memory`, applied at `import rljax` when the parent set
  RLJAX_KEEP_FREED_MEMORY=1), in transparent huge pages (glibc's tunable, set by the parent)
  or glibc's default (blocks above a dynamic threshold mapped on every allocation, 4 KB
  pages, returned on free)."""
  from rljax.host_memory import keep_freed_host_memory_if_asked

  if keep_freed_host_memory_if_asked():
    return "kept"
  if HUGE_PAGES_TUNABLE in os.environ.get("GLIBC_TUNABLES", "").split(":"):
    return f"huge pages ({HUGE_PAGES_TUNABLE})"
  return "returned (glibc default)"


def host_memory_environ(env: dict, mode: str) -> dict:
  """`env` for a worker whose allocator is `mode` (one of HOST_MEMORY)."""
  if mode not in HOST_MEMORY:
    raise ValueError(f"host memory mode {mode!r} is not one of {HOST_MEMORY}")
  env = dict(env, **{HOST_MEMORY_ENV: "1" if mode == "keep-freed" else "0"})
  if mode != "keep-freed":   # this script's own `import rljax` may have added the XLA flag
    env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split()
                                if not f.startswith(HEAP_FLAG))
  tunables = [t for t in env.pop("GLIBC_TUNABLES", "").split(":")
              if t and not t.startswith(HUGE_PAGES_TUNABLE.split("=")[0])]
  if tunables:
    env["GLIBC_TUNABLES"] = ":".join(tunables)
  if mode == "huge-pages":
    env = huge_pages_environ({k: v for k, v in env.items() if k != "RLJAX_HUGE_PAGES"}) or env
  return env


def rljax_worker(spec: dict) -> None:
  """Loads the saved model into rljax, reports CONFIG, then runs one step per command."""
  freed = host_memory()
  cpus = pin_cpus(spec["threads"])   # before JAX starts its thread pool
  from rljax.models import load_hf

  model, cfg = load_hf(spec["model_dir"])
  grpo = RljaxGRPO(model, group=spec["group"], new_tokens=spec["new_tokens"],
                   stop_tokens=spec["stop_tokens"], pack=spec["pack"],
                   loss_agg=spec["loss_agg"], lr=spec["lr"], devices=spec.get("rljax_devices", 1))
  emit("CONFIG", {**grpo.config(spec["prompts"], spec["prompt_len"]), "cpus": cpus,
                  "xla_cpu_devices": grpo.mesh.devices.size, "freed_host_memory": freed})
  ids = prompt_ids(spec["steps"], cfg.vocab_size, prompts=spec["prompts"],
                   prompt_len=spec["prompt_len"])
  flops = None
  if spec.get("roofline"):
    from update_roofline import train_flops

    flops = train_flops(cfg, spec["prompts"] * spec["group"], spec["prompt_len"],
                        spec["new_tokens"])
  steps = 0
  while wait_command() == "step":
    out = {}
    if flops:   # the sustained matmul rate right before this step, outside its timings
      out["roofline_gflops"] = matmul_roofline()
    usage = process_usage()
    out.update(grpo.iteration(ids[steps % len(ids)], 100 + steps,
                              time_recompute=spec["time_recompute"]))
    out.update(usage_since(usage))
    if flops:
      out["update_gflops"] = flops / out["update"] / 1e9
    steps += 1
    out["optimizer_steps"] = int(grpo.state.step)
    emit("STEP", out)
  emit("DONE", {"rss_peak_mb": round(rss_peak_mb(), 1), "xla_update": grpo.update_memory(),
                "xla_threads": process_threads("tf_XLAEigen"),
                "update_gflop": flops and flops / 1e9,
                "update_compiles": grpo.update_step._cache_size()})


def trl_config(trainer, args, prompts: int, prompt_len: int) -> dict:
  """TRL's configuration in the `COMPARED` vocabulary, read from the built trainer."""
  import torch

  model = trainer.model
  dtype = {p.dtype for p in model.parameters()}
  compute = "bfloat16" if args.bf16 else "float16" if args.fp16 else "float32"
  losses = {v: k for k, v in TRL_LOSS.items()}
  per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps
  return {
      "dtype": f"{compute} compute, {'/'.join(sorted(str(d).split('.')[1] for d in dtype))}"
               " params",
      "threads": torch.get_num_threads(),
      "prompts": per_step // args.num_generations, "group": args.num_generations,
      "completions": args.generation_batch_size, "prompt_len": prompt_len,
      "new_tokens": args.max_completion_length,
      "stop_tokens": sorted(set(args.generation_kwargs.get("eos_token_id", []) or [])),
      "loss_agg": losses.get(trainer.loss_type, f"TRL {trainer.loss_type}"),
      "eps_low": float(trainer.epsilon_low), "eps_high": float(trainer.epsilon_high),
      "kl_coef": float(trainer.beta),
      "advantage": ("group mean, / group std" if trainer.scale_rewards == "group"
                    else f"TRL scale_rewards={trainer.scale_rewards}"),
      # optimizer steps per generation batch: steps_per_generation x num_iterations batches,
      # one step per gradient_accumulation_steps of them
      "updates_per_rollout": (args.steps_per_generation * trainer.num_iterations
                              // args.gradient_accumulation_steps),
      "micro_batches": args.gradient_accumulation_steps,
      "optimizer": "adamw" if args.optim.startswith("adamw") else args.optim,
      "lr": float(args.learning_rate), "adam_b1": float(args.adam_beta1),
      "adam_b2": float(args.adam_beta2), "adam_eps": float(args.adam_epsilon),
      "weight_decay": float(args.weight_decay), "grad_clip": float(args.max_grad_norm),
      "activation_checkpointing": bool(getattr(args, "activation_checkpointing", False)
                                       or args.gradient_checkpointing or getattr(
                                           model, "is_activation_checkpointing", False)),
      # with one update per rollout TRL reuses the detached log-probs of the loss forward
      "old_logp_forward": bool(args.gradient_accumulation_steps
                               % (args.steps_per_generation * trainer.num_iterations)),
      "temperature": float(args.temperature), "top_p": float(args.top_p),
      "top_k": int(args.top_k or 0),
      # not compared
      "optim": args.optim, "lr_scheduler": str(args.lr_scheduler_type),
      "torch_compile": bool(args.torch_compile),
      "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "(unset)"),
      "torch": torch.__version__,
  }


def trl_worker(spec: dict) -> None:
  """Builds TRL's GRPOTrainer on the saved model, reports CONFIG, one step per command."""
  freed = host_memory()
  cpus = pin_cpus(spec["threads"])
  import datasets
  import torch
  import transformers
  import trl

  torch.set_num_threads(len(cpus))
  transformers.utils.logging.disable_progress_bar()
  vocab = json.load(open(os.path.join(spec["model_dir"], "config.json")))["vocab_size"]
  tokenizer = word_tokenizer(vocab)
  ids = prompt_ids(spec["steps"], vocab, prompts=spec["prompts"], prompt_len=spec["prompt_len"])
  flat = ids.reshape(-1, spec["prompt_len"])
  texts = [" ".join(f"t{int(t)}" for t in row) for row in flat]
  assert tokenizer(texts[0])["input_ids"] == [int(t) for t in flat[0]]
  rng = np.random.default_rng(0)
  stops = list(spec["stop_tokens"])

  def reward(completions, **_):
    return [float(x) for x in rng.random(len(completions))]

  kwargs = dict(
      output_dir=scratch_dir("trl_bench_"), use_cpu=True, report_to="none",
      save_strategy="no", logging_strategy="no", disable_tqdm=True, max_steps=spec["steps"],
      per_device_train_batch_size=spec["prompts"] * spec["group"],
      gradient_accumulation_steps=1, num_generations=spec["group"],
      max_completion_length=spec["new_tokens"], learning_rate=spec["lr"],
      lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
      beta=0.0, use_vllm=False, temperature=1.0, top_p=1.0, top_k=0, seed=0,
      loss_type=TRL_LOSS[spec["loss_agg"]], epsilon=0.2, scale_rewards="group",
      # GRPOConfig defaults to bf16 autocast and gradient checkpointing: rljax does neither
      bf16=False, fp16=False, gradient_checkpointing=False, activation_checkpointing=False,
      generation_kwargs=({"eos_token_id": stops} if stops
                         else {"min_new_tokens": spec["new_tokens"]}),
      shuffle_dataset=False, dataloader_num_workers=0)
  args = trl.GRPOConfig(**{**kwargs, **spec.get("trl_overrides", {})})
  gen_times, tokens, optimizer_steps = [], [], [0]

  class Timed(trl.GRPOTrainer):
    def _generate_and_score_completions(self, *a, **k):
      t0 = time.perf_counter()
      out = super()._generate_and_score_completions(*a, **k)
      gen_times.append(time.perf_counter() - t0)
      tokens.append(int(out["completion_mask"].sum()))
      return out

  class Driven(transformers.TrainerCallback):
    """Waits for the parent's "step" before each step; reports it when it ends."""

    def on_step_begin(self, *_, **__):
      if wait_command() != "step":
        raise SystemExit(0)
      self.t0, self.usage = time.perf_counter(), process_usage()

    def on_optimizer_step(self, *_, **__):
      optimizer_steps[0] += 1

    def on_step_end(self, *_, **__):
      total = time.perf_counter() - self.t0
      emit("STEP", {"generate": gen_times[-1], "train": total - gen_times[-1], "total": total,
                    **usage_since(self.usage), "tokens": tokens[-1],
                    "optimizer_steps": optimizer_steps[0]})

  model = transformers.AutoModelForCausalLM.from_pretrained(spec["model_dir"],
                                                            dtype=torch.float32)
  trainer = Timed(model=model, reward_funcs=reward, args=args,
                  train_dataset=datasets.Dataset.from_list([{"prompt": t} for t in texts]),
                  processing_class=tokenizer, callbacks=[Driven()])
  emit("CONFIG", {**trl_config(trainer, args, spec["prompts"], spec["prompt_len"]),
                  "cpus": cpus, "trl": trl.__version__, "freed_host_memory": freed})
  trainer.train()
  wait_command()
  emit("DONE", {"rss_peak_mb": round(rss_peak_mb(), 1)})


# ----------------------------------------------------------------------------- parent
class Worker:
  """One side in its own process, driven over stdin / stdout (`emit` protocol)."""

  def __init__(self, side: str, spec: dict, omp_wait_policy: str = "passive",
               script: str = __file__):
    env = dict(os.environ)
    if omp_wait_policy != "default":
      env["OMP_WAIT_POLICY"] = omp_wait_policy.upper()
    # XLA's CPU backend only: with the optional libtpu installed (pyproject's `plan` extra),
    # JAX would first load it looking for a TPU (+95 MB resident in every JAX worker)
    env.setdefault("JAX_PLATFORMS", "cpu")
    if side == "rljax":   # XLA CPU devices, the rows data-parallel over them
      env["JAX_NUM_CPU_DEVICES"] = str(spec.get("rljax_devices", 1))
    # both sides the same allocator (`import rljax`, first in either worker, applies
    # keep-freed; glibc reads the huge-page tunable when the worker starts)
    env = host_memory_environ(env, spec.get("host_memory", "glibc"))
    here = os.path.dirname(os.path.abspath(__file__))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [here, env.get("PYTHONPATH", "")]))
    self.side = side
    self.proc = subprocess.Popen(
        [sys.executable, os.path.abspath(script), "--worker", side, "--spec", json.dumps(spec)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    self.config = self.expect("CONFIG")

  def expect(self, tag: str) -> dict:
    for line in self.proc.stdout:
      if line.startswith(tag + " "):
        return json.loads(line[len(tag) + 1:])
      if line.strip():
        print(f"  [{self.side}] {line.rstrip()}", flush=True)
    raise RuntimeError(f"{self.side} worker exited with status {self.proc.wait()} before {tag}")

  def wait_ready(self) -> None:
    """Blocks until the worker has warmed up (a sampler worker's READY after its warm-up
    calls): timed calls start only once every worker is idle."""
    self.expect("READY")

  def send(self, command: str) -> None:
    self.proc.stdin.write(command + "\n")
    self.proc.stdin.flush()

  def step(self) -> dict:
    self.send("step")
    return self.expect("STEP")

  def close(self) -> dict:
    self.send("done")
    out = self.expect("DONE")
    self.proc.stdin.close()
    self.proc.wait()
    return out

  def kill(self) -> None:
    if self.proc.poll() is None:
      self.proc.kill()
      self.proc.wait()


def mismatches(a: dict, b: dict, fields=COMPARED) -> list[str]:
  """The fields (of `fields`) whose values differ between two configurations."""
  return [f for f in fields if a.get(f, "<missing>") != b.get(f, "<missing>")]


def print_configs(configs: dict[str, dict], fields=COMPARED) -> None:
  """Both configurations side by side: the compared `fields` first (marked `!=` when they
  differ), then the other reported fields (marked `.`)."""
  names = list(configs)
  keys = list(fields) + sorted({k for c in configs.values() for k in c} - set(fields))
  bad = set(mismatches(*configs.values(), fields=fields)) if len(names) == 2 else set()
  print(f"{'field':26s} " + " | ".join(f"{n:44s}" for n in names))
  for k in keys:
    mark = "!=" if k in bad else ("  " if k in fields else " .")
    vals = " | ".join(f"{str(configs[n].get(k, '-'))[:44]:44s}" for n in names)
    print(f"{mark}{k:24s} {vals}")


def check_configs(configs: dict[str, dict], fields=COMPARED, what="configuration") -> None:
  """Exits with status 2, naming the fields, if the two sides' values differ."""
  bad = mismatches(*configs.values(), fields=fields)
  if bad:
    a, b = configs
    detail = "; ".join(f"{f}: {a}={configs[a].get(f)!r} vs {b}={configs[b].get(f)!r}"
                       for f in bad)
    print(f"\nFAIL: the two sides' {what} differ in {', '.join(bad)} ({detail})", flush=True)
    raise SystemExit(2)


def run_pair(spec: dict, *, schedule: str = "alternate", omp_wait_policy: str = "passive",
             sides=("rljax", "trl"), script: str = __file__) -> dict:
  """Both workers on the same `spec`; configurations checked, then `spec["steps"]` steps
  each (alternating or one side after the other). Returns {side: {"config", "steps", "done"}}.
  `script` runs the workers (`script --worker <side> --spec ...`): this file, or another
  comparison that reuses this protocol (`vs_tunix.py`).

  In the sequential schedule a worker is started only when the previous one has finished,
  except that both are started first to compare configurations (the idle one holds just
  its model), so a mismatch costs no timed step.
  """
  workers = {}
  try:
    for side in sides:
      workers[side] = Worker(side, spec, omp_wait_policy, script=script)
    configs = {s: w.config for s, w in workers.items()}
    print_configs(configs)
    if len(sides) == 2:
      check_configs(configs)
    steps = {s: [] for s in sides}
    done = {}
    if schedule == "alternate":
      for i in range(spec["steps"]):
        for side in (sides if i % 2 == 0 else sides[::-1]):
          steps[side].append(workers[side].step())
          _print_step(side, i, steps[side][-1])
      done = {s: w.close() for s, w in workers.items()}
    else:
      for side in sides:
        for i in range(spec["steps"]):
          steps[side].append(workers[side].step())
          _print_step(side, i, steps[side][-1])
        done[side] = workers[side].close()
  finally:
    for w in workers.values():
      w.kill()
  out = {s: {"config": workers[s].config, "steps": steps[s], "done": done[s]} for s in sides}
  if len(sides) == 2:
    observed = {s: observed_per_step(out[s]["steps"]) for s in sides}
    # with stop tokens the two sides sample different lengths: compare the updates only
    fields = OBSERVED[1:] if spec["stop_tokens"] else OBSERVED
    check_configs(observed, fields, "observed work")
  return out


def observed_per_step(steps: list[dict]) -> dict:
  """What a side did per step: completion tokens (all steps' values) and optimizer steps."""
  return {"completion_tokens_per_step": [s["tokens"] for s in steps],
          "optimizer_steps": [s["optimizer_steps"] for s in steps]}


def _print_step(side: str, i: int, r: dict) -> None:
  keys = ("generate", "update", "train", "old_logp", "total", "cpu_s", "sys_s")
  parts = " ".join(f"{k} {r[k]:.2f}s" for k in keys if k in r)
  peaks = " ".join(f"{k[9:-3]} {r[k]:.0f}" for k in ("rss_peak_after_generate_mb",
                                                    "rss_peak_after_update_mb") if k in r)
  moved = (f" | update copied {r['params_moved']} of {r['params']} parameter arrays"
           if r.get("params_moved") else "")
  print(f"  {side:5s} step {i + 1}: {parts}" + (f" | peak RSS MB {peaks}" if peaks else "")
        + moved, flush=True)


def summarise(runs: dict, warmup: int) -> dict:
  """Medians (min-max) over the timed steps of each side."""
  out = {}
  for side, run in runs.items():
    steps = run["steps"][warmup:]
    out[side] = {k: statistics.median(s[k] for s in steps)
                 for k in steps[0] if isinstance(steps[0][k], float)}
    out[side]["min_max"] = [sig(min(s["total"] for s in steps)),
                            sig(max(s["total"] for s in steps))]
  return out


def make_spec(args, model_dir: str, vocab: int) -> dict:
  longtail = args.longtail
  shape = (REDUCED if args.reduced else
           dict(prompts=PROMPTS, group=GROUP, prompt_len=PROMPT_LEN, new_tokens=NEW_TOKENS))
  return {"model_dir": model_dir, "prompts": shape["prompts"], "group": shape["group"],
          "prompt_len": shape["prompt_len"],
          "new_tokens": LONGTAIL_TOKENS if longtail else shape["new_tokens"],
          "stop_tokens": list(LONGTAIL_STOPS) if longtail else [], "pack": longtail,
          "loss_agg": "seq_mean_token_mean", "lr": LR, "threads": args.threads,
          "rljax_devices": args.rljax_devices or rljax_cpu_devices(
              shape["prompts"] * shape["group"], args.threads or len(os.sched_getaffinity(0))),
          "steps": args.warmup + args.reps, "time_recompute": args.time_recompute,
          "vocab": vocab, "trl_overrides": parse_overrides(args.trl_override),
          "host_memory": args.host_memory}


def parse_overrides(items: list[str]) -> dict:
  """["bf16=true", "loss_type=dapo"] -> {"bf16": True, "loss_type": "dapo"}."""
  out = {}
  for item in items:
    key, _, value = item.partition("=")
    try:
      out[key] = json.loads(value)
    except json.JSONDecodeError:
      out[key] = value
  return out


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--reps", type=int, default=6, help="timed steps per framework")
  parser.add_argument("--warmup", type=int, default=2, help="untimed steps per framework")
  parser.add_argument("--threads", type=int, default=0,
                      help="CPUs (and threads) per side; 0: all CPUs this process may use")
  parser.add_argument("--rljax-devices", type=int, default=0,
                      help="XLA CPU devices of the rljax worker (JAX_NUM_CPU_DEVICES), the rows "
                      "data-parallel over them; 0: one per CPU when each gets >= 32 rows")
  parser.add_argument("--omp-wait-policy", default="passive",
                      choices=["passive", "active", "default"],
                      help="OMP_WAIT_POLICY of the workers (torch's OpenMP); see the docstring")
  parser.add_argument("--schedule", default="alternate", choices=["alternate", "sequential"])
  parser.add_argument("--longtail", action="store_true",
                      help="completions stop at 10 stop ids within 256 tokens (long-tailed lengths)")
  parser.add_argument("--time-recompute", action="store_true",
                      help="also time rljax's separate old-log-prob forward (outside the step)")
  parser.add_argument("--trl-override", action="append", default=[], metavar="KEY=VALUE",
                      help="a GRPOConfig field for TRL only (JSON value), e.g. bf16=true: "
                           "the configuration check then names the field that differs")
  parser.add_argument("--host-memory", choices=HOST_MEMORY, default="huge-pages",
                      help="both workers' allocator: XLA's temporaries in transparent huge "
                           "pages (the `rljax` command's default), freed blocks kept for reuse "
                           "(RLJAX_KEEP_FREED_MEMORY=1), or glibc's defaults "
                           "(`rljax.host_memory`)")
  parser.add_argument("--peer", choices=["trl", "none"], default="trl",
                      help="none: the rljax worker alone (RESULT peer and ratios null)")
  parser.add_argument("--reduced", action="store_true",
                      help="seconds: the reduced model and shapes (`workload.REDUCED`), "
                      "--reps 2 --warmup 1 (CI's run; measures nothing)")
  parser.add_argument("--worker", choices=["rljax", "trl"], help=argparse.SUPPRESS)
  parser.add_argument("--spec", help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.worker:
    (rljax_worker if args.worker == "rljax" else trl_worker)(json.loads(args.spec))
    return
  if args.reduced:
    args.reps, args.warmup = 2, 1

  load_before = os.getloadavg()
  with tempfile.TemporaryDirectory() as model_dir:
    save_hf(model_dir, reduced=args.reduced)
    spec = make_spec(args, model_dir, hf_config(args.reduced)["vocab_size"])
    sides = ("rljax", "trl") if args.peer == "trl" else ("rljax",)
    runs = run_pair(spec, schedule=args.schedule, omp_wait_policy=args.omp_wait_policy,
                    sides=sides)
  load_after = os.getloadavg()
  res = result_line(args, spec, runs, load_before, load_after)
  print_summary(args, res, runs, load_before, load_after)
  print("RESULT " + json.dumps(res))


def result_line(args, spec: dict, runs: dict, load_before, load_after) -> dict:
  """The RESULT dict: medians over the timed steps, ratio = TRL / rljax (null without
  TRL), the configuration both sides ran."""
  med = summarise(runs, args.warmup)
  rl = med["rljax"]
  peer = med.get("trl")
  cfg = runs["rljax"]["config"]
  trl_cfg = runs["trl"]["config"] if peer else {}
  quotient = lambda a, b: sig(a / b) if peer else None  # noqa: E731
  res = {
      "metric": "grpo_step_seconds_longtail" if args.longtail else "grpo_step_seconds",
      "rljax": sig(rl["total"]), "peer": peer and sig(peer["total"]),
      "ratio": quotient(peer and peer["total"], rl["total"]),
      "rljax_generate": sig(rl["generate"]), "rljax_update": sig(rl["update"]),
      "peer_generate": peer and sig(peer["generate"]),
      "peer_train": peer and sig(peer["train"]),
      "ratio_generate": quotient(peer and peer["generate"], rl["generate"]),
      "ratio_train": quotient(peer and peer["train"], rl["update"]),
      "rljax_min_max": rl["min_max"], "peer_min_max": peer and peer["min_max"],
      "rljax_cpu_s": round(rl["cpu_s"], 2), "peer_cpu_s": peer and round(peer["cpu_s"], 2),
      "rljax_sys_s": round(rl["sys_s"], 2), "peer_sys_s": peer and round(peer["sys_s"], 2),
      "rljax_page_faults": int(rl["page_faults"]),
      "peer_page_faults": peer and int(peer["page_faults"]),
      "freed_host_memory": cfg["freed_host_memory"],
      "threads": cfg["threads"], "omp_wait_policy": trl_cfg.get("omp_wait_policy"),
      "rljax_cpu_devices": cfg["xla_cpu_devices"],
      "schedule": args.schedule, "reps": args.reps, "warmup": args.warmup,
      "trl_version": trl_cfg.get("trl"),
      "config": {k: cfg[k] for k in ("prompts", "group", "completions", "prompt_len",
                                      "new_tokens", "loss_agg", "dtype")},
      "reduced": args.reduced,
      "completion_tokens_per_step": spec["prompts"] * spec["group"] * spec["new_tokens"],
      "rljax_rss_peak_mb": runs["rljax"]["done"]["rss_peak_mb"],
      "peer_rss_peak_mb": peer and runs["trl"]["done"]["rss_peak_mb"],
      "rljax_xla_update_peak_mb": runs["rljax"]["done"]["xla_update"]["peak_mb"],
      "loadavg_before": [round(x, 2) for x in load_before],
      "loadavg_after": [round(x, 2) for x in load_after],
  }
  if args.time_recompute:
    res["rljax_old_logp"] = sig(rl["old_logp"])
    res["ratio_with_recompute"] = quotient(peer and peer["total"], rl["total"] + rl["old_logp"])
  return res


def print_summary(args, res: dict, runs: dict, load_before, load_after) -> None:
  """The human-readable medians above the RESULT line."""
  med = summarise(runs, args.warmup)
  rl, peer = med["rljax"], med.get("trl")
  print(f"\nmedians over {args.reps} steps each (load average {load_before[0]:.1f} -> "
        f"{load_after[0]:.1f} on {os.cpu_count()} cores; {res['threads']} threads per side, "
        f"OMP_WAIT_POLICY {res['omp_wait_policy']}; freed host memory "
        f"{res['freed_host_memory']}; rljax on {res['rljax_cpu_devices']} XLA CPU device(s), "
        f"rows data-parallel), TRL {res['trl_version']}")
  print(f"  rljax  total {rl['total']:6.2f} s = generate {rl['generate']:.2f} + update "
        f"{rl['update']:.2f}  (min-max {rl['min_max']})")
  sides = [("rljax", rl)]
  if peer:
    print(f"  TRL    total {peer['total']:6.2f} s = generate {peer['generate']:.2f} + train "
          f"{peer['train']:.2f}  (min-max {peer['min_max']})")
    sides.append(("TRL", peer))
  for name, side in sides:
    print(f"  {name:5s}  per step: {side['cpu_s']:.2f} CPU-s, of which {side['sys_s']:.2f} in the "
          f"kernel; {side['page_faults']:,.0f} page faults")
  if peer:
    print(f"  ratio (TRL / rljax): end-to-end {res['ratio']:.2f}x, generate "
          f"{res['ratio_generate']:.2f}x, train {res['ratio_train']:.2f}x")


if __name__ == "__main__":
  main()
