"""The shared workload of the benchmarks and the rljax side of a GRPO step on it.

The model: a Qwen2-layout decoder with random weights (`HF_CONFIG`: vocab 512, width 256,
MLP 768, 4 layers, 4 query heads x 64, 2 KV heads, untied lm head, rope θ 1e4; 3.41 M
parameters) built with torch from a fixed seed, saved with `save_pretrained` and loaded
with `rljax.models.load_hf`. A GRPO step: `PROMPTS` prompts of `PROMPT_LEN` tokens x `GROUP`
samples of `NEW_TOKENS` tokens, one AdamW update at `LR`. Also the process helpers every
comparison uses (CPU pinning, thread counts, peak RSS, CPU seconds, the matmul roofline).
`benchmarks/README.md` has the tables.
"""

from __future__ import annotations

import atexit
import os
import pathlib
import shutil
import statistics
import sys
import tempfile
import time
from types import SimpleNamespace

import numpy as np


def rljax_checkout_warning(rljax_file: str | None = None) -> str:
  """A warning when `rljax` is imported from another tree than this checkout's ("" when it
  is this one): with a venv installed (`pip install -e`) from another checkout, the scripts
  here, which put only `benchmarks/` on the path, would time that checkout's code."""
  if rljax_file is None:
    import rljax

    rljax_file = rljax.__file__
  here = pathlib.Path(__file__).resolve().parents[1]
  imported = pathlib.Path(rljax_file).resolve().parents[1]
  if imported == here:
    return ""
  return (f"WARNING: rljax is imported from {imported}, not from this checkout ({here}): "
          f"the benchmark times that code. `pip install -e .` here, or set PYTHONPATH={here}")


if _warning := rljax_checkout_warning():
  print(_warning, file=sys.stderr, flush=True)

PROMPTS, GROUP, PROMPT_LEN, NEW_TOKENS, LR = 8, 8, 32, 96, 1e-5


HF_CONFIG = dict(vocab_size=512, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                 max_position_embeddings=512, rope_theta=10000.0, tie_word_embeddings=False,
                 rms_norm_eps=1e-6)

# `--reduced` (every script in benchmarks/): the same Qwen2 layout at a size that runs in
# seconds, so CI runs every script end to end (tests/test_benchmarks_reduced.py); its
# figures measure nothing.
REDUCED_HF_CONFIG = dict(HF_CONFIG, vocab_size=64, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                         head_dim=16)
REDUCED = dict(prompts=2, group=2, prompt_len=8, new_tokens=8)
REDUCED_ROOFLINE = dict(n=256, warm=2, reps=3)   # `matmul_roofline` kwargs of a reduced run


def hf_config(reduced: bool = False) -> dict:
  """The benchmark model's `Qwen2Config` kwargs: `HF_CONFIG`, or `REDUCED_HF_CONFIG`."""
  return dict(REDUCED_HF_CONFIG if reduced else HF_CONFIG)


def trainer_modules():
  """The rljax trainer internals this benchmark drives, imported in this one place: the
  config and its specs, the parameter room, the compiled forward passes and update step."""
  from rljax.train.config import base_config, validate
  from rljax.train.config.specs import build_specs
  from rljax.train.params import Params
  from rljax.train.run.task_and_models import optimizer
  from rljax.train.update import objective
  from rljax.train.update.forward import ForwardFns
  from rljax.train.update.step import build_update_step

  return SimpleNamespace(base_config=base_config, validate=validate, build_specs=build_specs,
                         Params=Params, optimizer=optimizer, ForwardFns=ForwardFns,
                         build_update_step=build_update_step, objective=objective)


def build_hf(seed: int = 0, *, reduced: bool = False, **overrides):
  """The random-weight Qwen2 built with torch from a fixed seed (`hf_config(reduced)` +
  overrides)."""
  import torch
  import transformers

  torch.manual_seed(seed)
  cfg = transformers.Qwen2Config(**{**hf_config(reduced), **overrides})
  return transformers.Qwen2ForCausalLM(cfg)


def save_hf(path: str, seed: int = 0, *, reduced: bool = False, **overrides) -> str:
  """Builds the seeded model (the reduced one with `reduced`) and saves it (safetensors)
  to `path`; returns `path`."""
  build_hf(seed, reduced=reduced, **overrides).save_pretrained(path)
  return path


def load_into_rljax(hf_model):
  """save_pretrained -> rljax.models.load_hf (the public import path)."""
  from rljax.models import load_hf

  with tempfile.TemporaryDirectory() as path:
    hf_model.save_pretrained(path)
    return load_hf(path)


def word_tokenizer(vocab: int):
  """A fast tokenizer where "t17 t3 ..." maps word by word to ids 17, 3, ... (0 pad, 1 eos)."""
  from tokenizers import Tokenizer, models, pre_tokenizers
  from transformers import PreTrainedTokenizerFast

  words = {"<pad>": 0, "<eos>": 1, **{f"t{i}": i for i in range(2, vocab)}}
  tok = Tokenizer(models.WordLevel(words, unk_token="<pad>"))
  tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>",
                                 eos_token="<eos>", unk_token="<pad>")


def prompt_ids(steps: int, vocab: int, seed: int = 0, prompts: int = PROMPTS,
               prompt_len: int = PROMPT_LEN) -> np.ndarray:
  """[steps, prompts, prompt_len] token ids in [2, vocab) (0 = pad, 1 = eos)."""
  return np.random.default_rng(seed).integers(2, vocab, (steps, prompts, prompt_len))


def sig(x: float, digits: int = 4) -> float:
  """`x` to `digits` significant figures (a reduced shape's calls take milliseconds, so
  a fixed number of decimals would round them to 0)."""
  return float(f"{x:.{digits}g}")


# ----------------------------------------------------------------------------- threads
def rljax_cpu_devices(rows: int, cpus: int, min_rows_per_device: int = 32) -> int:
  """XLA CPU devices (`JAX_NUM_CPU_DEVICES`) for an rljax worker of `rows` rows on `cpus`
  CPUs: one per CPU, the rows data-parallel over them, when each gets at least
  `min_rows_per_device` rows; else one device whose ops use all the threads.

  Measured on 2 CPUs (`sampler_vs_hf.py`, benchmarks/README.md): 64 rows decode ~1.27x
  faster on 2 devices than on one (each core runs its own small matmuls, no thread handoff
  inside each); 8 rows ~1.26x slower (each device streams all the weights for 4 rows).
  """
  return cpus if cpus > 1 and rows // cpus >= min_rows_per_device else 1


def pin_cpus(threads: int) -> list[int]:
  """Restricts this process to its first `threads` allowed CPUs (0: all); returns them.

  Call before JAX creates its CPU client: XLA sizes its thread pool from the affinity.
  """
  cpus = sorted(os.sched_getaffinity(0))
  if threads:
    if threads > len(cpus):
      raise SystemExit(f"--threads {threads}: only {len(cpus)} CPUs allowed ({cpus})")
    cpus = cpus[:threads]
    os.sched_setaffinity(0, cpus)
  return cpus


def process_threads(prefix: str) -> int:
  """Threads of this process whose name starts with `prefix` (XLA's pool: "tf_XLAEigen")."""
  names = []
  for tid in os.listdir("/proc/self/task"):
    try:
      with open(f"/proc/self/task/{tid}/comm") as f:
        names.append(f.read().strip())
    except OSError:
      pass
  return sum(n.startswith(prefix) for n in names)


def rss_peak_mb() -> float:
  """This process's resident-set high-water mark (getrusage ru_maxrss, KiB on Linux)."""
  import resource

  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def scratch_dir(prefix: str) -> str:
  """A new temporary directory, removed when this process exits (a benchmark's run.dir)."""
  path = tempfile.mkdtemp(prefix=prefix)
  atexit.register(shutil.rmtree, path, ignore_errors=True)
  return path


def rss_mb() -> float:
  """This process's resident set now (Linux `/proc/self/statm`; 0 elsewhere)."""
  try:
    with open("/proc/self/statm") as f:
      return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20
  except OSError:
    return 0.0


def process_usage() -> dict:
  """This process's CPU seconds (user + system), system seconds and minor page faults so
  far, all threads (floats, so that step summaries take their medians)."""
  import resource

  r = resource.getrusage(resource.RUSAGE_SELF)
  return {"cpu_s": r.ru_utime + r.ru_stime, "sys_s": r.ru_stime,
          "page_faults": float(r.ru_minflt)}


def usage_since(before: dict) -> dict:
  """`process_usage()` now minus `before`."""
  now = process_usage()
  return {k: now[k] - before[k] for k in now}


def _median_dot_seconds(a_shape, b_shape, warm: int, reps: int) -> float:
  """Median seconds of a jitted fp32 `jnp.dot` of random `a_shape` x `b_shape` arrays over
  `reps` calls, after `warm` untimed ones."""
  import jax
  import jax.numpy as jnp

  a = jax.random.normal(jax.random.key(0), a_shape, jnp.float32)
  b = jax.random.normal(jax.random.key(1), b_shape, jnp.float32)
  dot = jax.jit(jnp.dot)
  for _ in range(warm):
    dot(a, b).block_until_ready()
  times = []
  for _ in range(reps):
    t0 = time.perf_counter()
    dot(a, b).block_until_ready()
    times.append(time.perf_counter() - t0)
  return statistics.median(times)


def matmul_roofline(n: int = 1024, warm: int = 10, reps: int = 5) -> float:
  """Sustained fp32 `jnp.dot` rate on n³ (GFLOP/s): `warm` untimed dots, median of `reps`.

  The first dots after a long step run at ~60 % of the steady rate (threads and caches
  cold), hence the warm-up.
  """
  return 2 * n ** 3 / _median_dot_seconds((n, n), (n, n), warm, reps) / 1e9


def weight_stream_gbps(rows: int = 8, k: int = 896, n: int = 151_936, warm: int = 3,
                       reps: int = 5) -> float:
  """The rate (GB/s) at which a decode step can read fp32 weights here: a jitted
  `[rows, k] @ [k, n]` product (default: batch 8 against Qwen2.5-0.5B's 544 MB lm head),
  the weight's bytes over the median time of `reps` calls after `warm`. A decode step at a
  few rows reads every weight once and does little else, so parameter bytes x steps / this
  rate bounds a sampler from below."""
  return 4 * k * n / _median_dot_seconds((rows, k), (k, n), warm, reps) / 1e9


# ----------------------------------------------------------------------------- rljax
def _buffer_pointers(tree) -> list[int]:
  """Where each array of `tree` (its first shard) lives."""
  import jax
  return [x.addressable_shards[0].data.unsafe_buffer_pointer() for x in jax.tree.leaves(tree)]


class RljaxGRPO:
  """The trainer's pieces for one GRPO iteration on fixed shapes (no task, no tokenizer)."""

  def __init__(self, model, *, group=GROUP, new_tokens=NEW_TOKENS, stop_tokens=(), pack=False,
               loss_agg="seq_mean_token_mean", lr=LR, devices=1):
    import jax
    from flax import nnx

    from rljax import parallel
    from rljax.sampling import SamplingParams

    t = trainer_modules()
    c = t.base_config()
    c.sampling.n, c.sampling.max_new_tokens = group, new_tokens
    c.algo.update(old_logp_source="update",   # one update per rollout, as TRL here
                  loss_agg=loss_agg, epochs=1, minibatches=1, microbatches=1)
    c.optim.update(actor_lr=lr, warmup_steps=0, weight_decay=0.0, b1=0.9, b2=0.999,
                   grad_clip=1.0)   # TRL / transformers AdamW defaults
    self.c, self.model_cfg = c, model.cfg
    self.group, self.new_tokens, self.pack = group, new_tokens, pack
    self.sampling = SamplingParams(max_new_tokens=new_tokens, n=group,
                                   stop_tokens=tuple(stop_tokens))
    # rows data-parallel over `devices` XLA devices (JAX_NUM_CPU_DEVICES: one per core)
    self.mesh = parallel.make_mesh(data=-1, fsdp=1, tensor=1, devices=jax.devices()[:devices])
    parallel.shard_model(model, self.mesh)
    graphdef, params = nnx.split(model)
    self.merge = lambda: nnx.merge(graphdef, self.state.actor)   # the sampler's view
    groups = 1 if pack else 0   # packed rows (algo.pack_sequences) or the padded layout
    c.algo.pack_sequences = pack
    t.validate(c)
    specs = t.build_specs(c, model_description=repr(model.cfg), pack_groups=groups)
    tx = t.optimizer(c, c.optim.actor_lr)
    room = t.Params(actor_graphdef=graphdef, critic_graphdef=None, initial_actor=params,
                    initial_critic=None, actor_tx=tx, critic_tx=tx, mesh=self.mesh,
                    sources=specs.sources, seed=0, lora=False, critic_from_policy=True)
    self.state = room.init_state(params)
    assert self.state.ref is None, "no reference model: kl_coef is 0, as on TRL's side"
    shardings = jax.tree.map(lambda x: x.sharding, self.state)
    self.num_micro = specs.schedule.microbatches
    self.update_step = t.build_update_step(
        specs.loss, graphdef, None, tx, tx, self.num_micro, state_shardings=shardings,
        mesh=self.mesh,  # as `rljax train` builds it (train/run/iteration.make_trainer)
        compiler_options=parallel.low_memory_compiler_options(self.mesh, self.state,
                                                              remat=model.cfg.remat))
    self.fns = t.ForwardFns(specs.loss, graphdef, None, num_micro=self.num_micro,
                            mesh=self.mesh)
    self.last_minibatch = None

  def config(self, prompts: int, prompt_len: int) -> dict:
    """This side's configuration in the `COMPARED` vocabulary, read from its own objects."""
    a, o, s, m = self.c.algo, self.c.optim, self.sampling, self.model_cfg
    return {
        "dtype": f"{m.dtype} compute, {m.param_dtype} params",
        "threads": len(os.sched_getaffinity(0)),
        "prompts": prompts, "group": s.n, "completions": prompts * s.n,
        "prompt_len": prompt_len, "new_tokens": s.max_new_tokens,
        "stop_tokens": sorted(s.stop_tokens),
        "loss_agg": a.loss_agg, "eps_low": float(a.eps_low), "eps_high": float(a.eps_high),
        "kl_coef": float(a.kl_coef) if a.kl_placement != "none" else 0.0,
        "advantage": "group mean, / group std" if a.advantage == "grpo" else a.advantage,
        "updates_per_rollout": int(a.epochs) * int(a.minibatches),
        "micro_batches": self.num_micro, "optimizer": "adamw",
        "lr": float(o.actor_lr), "adam_b1": float(o.b1), "adam_b2": float(o.b2),
        "adam_eps": 1e-8,   # optax.adamw's default, which make_optimizer keeps
        "weight_decay": float(o.weight_decay), "grad_clip": float(o.grad_clip),
        "activation_checkpointing": bool(m.remat),
        "old_logp_forward": a.old_logp_source == "recompute",
        "temperature": float(s.temperature), "top_p": float(s.top_p), "top_k": int(s.top_k),
        # not compared
        "sampler": "continuous, all rows resident, one prefill per prompt",
        "update_layout": "packed" if self.pack else "padded",
    }

  def rollout(self, prompts, seed):
    """The trainer's default sampler: continuous batching with every row resident and
    one prefill per prompt for its samples (`sampling.continuous`, `share_prefill`)."""
    import jax

    from rljax.sampling.continuous import generate_continuous

    out = generate_continuous(self.merge(), prompts, np.ones_like(prompts),
                              sampling=self.sampling, rng=jax.random.key(seed),
                              slots=prompts.shape[0] * self.group, share_prefill=True,
                              mesh=self.mesh)
    rows = {"prompt_tokens": np.asarray(out.prompt_tokens),
            "prompt_mask": np.asarray(out.prompt_mask), "tokens": np.asarray(out.tokens),
            "mask": np.asarray(out.mask), "sampler_logp": np.asarray(out.logp, np.float32)}
    if not self.sampling.stop_tokens:
      assert rows["mask"].sum() == prompts.shape[0] * self.group * self.new_tokens
    return rows

  def minibatch(self, rows, seed):
    import jax
    import jax.numpy as jnp

    from rljax.ops.advantages import group_advantages
    from rljax.parallel import batch_sharding

    sh = batch_sharding(self.mesh)
    seq = {k: jax.device_put(rows[k], sh) for k in ("prompt_tokens", "prompt_mask", "tokens",
                                                      "mask")}
    b = rows["mask"].shape[0]
    scores = np.random.default_rng(seed).random(b).astype(np.float32)
    adv = group_advantages(jnp.asarray(scores).reshape(-1, self.group)).reshape(-1)
    ones = jnp.ones(rows["mask"].shape, jnp.float32)
    mb = dict(seq, advantages=adv, returns=jnp.zeros_like(ones), old_values=jnp.zeros_like(ones),
              token_weights=ones, is_weights=ones, kl_coef=self.state.kl_coef,
              rng=jax.random.key_data(jax.random.split(jax.random.key(seed), b)))
    if not self.pack:
      return seq, mb
    # the packing layout of these rows (one group: one device, one micro-batch)
    lengths = {"prompt_lengths": rows["prompt_mask"].sum(1), "lengths": rows["mask"].sum(1)}
    packed = self.fns.pack(lengths, rows["mask"].shape[1], rows["prompt_mask"].shape[1])
    seq.update(packed)
    mb.update(packed)
    return seq, mb

  def iteration(self, prompts, seed, *, time_recompute: bool = True):
    """One timed iteration: {"generate": s, "update": s, "total": s, "tokens": n,
    "old_logp": s} (old_logp: the recompute forward, timed after the step and not part of
    its total; only with `time_recompute`)."""
    import jax
    import jax.numpy as jnp

    t0 = time.perf_counter()
    rows = self.rollout(prompts, seed)
    t1 = time.perf_counter()
    peak_after_generate = rss_peak_mb()
    seq, mb = self.minibatch(rows, seed)
    mb["old_logp"] = mb["ref_logp"] = jnp.zeros(rows["mask"].shape, jnp.float32)  # unused
    before = _buffer_pointers(self.state.actor)
    self.state, metrics = self.update_step(self.state, mb, jnp.asarray(True))
    float(metrics["loss"])
    t2 = time.perf_counter()
    # parameters the donating update wrote elsewhere: a copy, e.g. while a hold on them lives
    moved = sum(a != b for a, b in zip(before, _buffer_pointers(self.state.actor)))
    self.last_minibatch = mb
    # the process's high-water mark after each phase: which phase set the peak
    out = {"generate": t1 - t0, "update": t2 - t1, "total": t2 - t0,
           "tokens": int(rows["mask"].sum()), "rss_peak_after_generate_mb": peak_after_generate,
           "rss_peak_after_update_mb": rss_peak_mb(), "params_moved": moved,
           "params": len(before)}
    if time_recompute:
      jax.block_until_ready(self.fns.policy_stats(self.state.actor, seq))
      out["old_logp"] = time.perf_counter() - t2
    return out

  def update_memory(self) -> dict:
    """XLA's compiled memory analysis of the update step (MB): arguments, outputs,
    temporaries and the peak args + out + temp - aliased (donated) bytes."""
    import jax.numpy as jnp

    m = self.update_step.lower(self.state, self.last_minibatch,
                               jnp.asarray(True)).compile().memory_analysis()
    mb = lambda x: round(x / 2 ** 20, 1)  # noqa: E731
    return {"args_mb": mb(m.argument_size_in_bytes), "out_mb": mb(m.output_size_in_bytes),
            "temp_mb": mb(m.temp_size_in_bytes), "alias_mb": mb(m.alias_size_in_bytes),
            "peak_mb": mb(m.argument_size_in_bytes + m.output_size_in_bytes
                          + m.temp_size_in_bytes - m.alias_size_in_bytes)}
