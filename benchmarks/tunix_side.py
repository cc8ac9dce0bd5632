"""Tunix's side of `vs_tunix.py`: its Qwen2 loaded by its own safetensors loader, its vanilla
`Sampler`, and one GRPO iteration of its `GRPOLearner` through `RLCluster` with the vanilla
rollout, each a worker process speaking `grpo_vs_trl.py`'s protocol (CONFIG, then one STEP
per "step" command, DONE).

The tokenizer maps "t17 t3 ..." word by word to ids 17, 3, ... like `workload.word_tokenizer`,
but its pad and eos ids are the vocabulary size and one more: ids the model can never
sample. So every row runs the full budget (no early stop), no sampled token is mistaken for
padding (Tunix masks a completion token equal to the pad id out of the loss), and both
sides do the same work on the same token ids.
"""

from __future__ import annotations

import json
import os
import time

import numpy as np
from grpo_vs_trl import TRL_LOSS, emit, host_memory, wait_command
from real_shapes import sampler_config
from workload import pin_cpus, process_usage, prompt_ids, rss_mb, rss_peak_mb, usage_since

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"   # jax.monitoring's
# Tunix loss_agg_mode -> rljax aggregation mode (tests/test_tunix_losses.py checks them)
LOSS_AGG = {"sequence-mean-token-mean": "seq_mean_token_mean", "token-mean": "token_mean"}
TUNIX_AGG = {v: k for k, v in LOSS_AGG.items()}
assert set(TUNIX_AGG) <= set(TRL_LOSS)   # the aggregation modes grpo_vs_trl's workers know


def start(spec: dict) -> list[int]:
  """Allocator, CPUs and one XLA CPU device, before JAX starts; returns the CPUs."""
  spec["freed"] = host_memory()
  cpus = pin_cpus(spec["threads"])
  os.environ["JAX_NUM_CPU_DEVICES"] = "1"
  return cpus


def tokenizer(vocab: int):
  """Word-level fast tokenizer over "t0" ... "t{vocab-1}"; pad = vocab, eos = vocab + 1."""
  from tokenizers import Tokenizer, models, pre_tokenizers
  from transformers import PreTrainedTokenizerFast

  words = {**{f"t{i}": i for i in range(vocab)}, "<pad>": vocab, "<eos>": vocab + 1}
  tok = Tokenizer(models.WordLevel(words, unk_token="<pad>"))
  tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>",
                                 unk_token="<pad>")


def texts(ids: np.ndarray) -> list[str]:
  return [" ".join(f"t{int(t)}" for t in row) for row in ids]


def load(model_dir: str, mesh=None):
  """(Tunix Qwen2, its ModelConfig) from the saved checkpoint, by Tunix's own loader
  (`tunix.models.qwen2.params.create_model_from_safe_tensors`), float32."""
  import jax.numpy as jnp
  from tunix.models.qwen2 import model as qwen2
  from tunix.models.qwen2 import params

  hf = json.load(open(os.path.join(model_dir, "config.json")))
  theta = (hf.get("rope_parameters") or {}).get("rope_theta", hf.get("rope_theta"))
  cfg = qwen2.ModelConfig(
      num_layers=hf["num_hidden_layers"], vocab_size=hf["vocab_size"],
      embed_dim=hf["hidden_size"], hidden_dim=hf["intermediate_size"],
      num_heads=hf["num_attention_heads"], head_dim=hf["head_dim"],
      num_kv_heads=hf["num_key_value_heads"], rope_theta=int(theta),
      norm_eps=hf["rms_norm_eps"], use_tied_embedding=hf["tie_word_embeddings"])
  return params.create_model_from_safe_tensors(model_dir, cfg, mesh=mesh, dtype=jnp.float32), cfg


def logits_probe(model, ids: np.ndarray, rows: int = 2, vocab: int = 16) -> list:
  """`real_shapes.logits_probe` for Tunix's model (causal mask, positions 0..P-1)."""
  import jax.numpy as jnp
  from tunix.generate import utils

  t = jnp.asarray(ids[:rows])
  positions = jnp.broadcast_to(jnp.arange(t.shape[1]), t.shape)
  mask = utils.make_causal_attn_mask(jnp.ones(t.shape, bool), t.shape[1])
  logits, _ = model(t, positions, None, mask)
  return np.asarray(logits[:, -1, :vocab], np.float64).tolist()


def dtype(cfg) -> str:
  import jax.numpy as jnp

  return f"{jnp.dtype(cfg.dtype).name} compute, {jnp.dtype(cfg.param_dtype).name} params"


def sampler_worker(spec: dict) -> None:
  """Tunix's vanilla `Sampler`, one call per "step" command: {"tunix": s}."""
  cpus = start(spec)
  import jax
  from tunix.generate import sampler as sampler_lib

  model, cfg = load(spec["model_dir"])
  p, n, b = spec["prompt_len"], spec["new_tokens"], spec["batch"]
  ids = prompt_ids(1, cfg.vocab_size, seed=1, prompts=b, prompt_len=p)[0]
  tok = tokenizer(cfg.vocab_size)
  sampler = sampler_lib.Sampler(model, tok, sampler_lib.CacheConfig(
      cache_size=p + n, num_layers=cfg.num_layers, num_kv_heads=cfg.num_kv_heads,
      head_dim=cfg.head_dim))
  prompts = texts(ids)
  settings = dict(temperature=1.0, top_p=1.0, top_k=None)   # top_p 1: sample the full softmax

  def call(seed):
    t0 = time.perf_counter()
    out = sampler(prompts, max_generation_steps=n, max_prompt_length=p, seed=seed, **settings)
    dt = time.perf_counter() - t0
    assert np.array_equal(out.padded_prompt_tokens, ids), "prompts differ from rljax's"
    assert all(len(t) == n for t in out.tokens), "a row stopped early"
    return dt

  eos = int(sampler.tokenizer.eos_id())
  emit("CONFIG", {**sampler_config(len(os.sched_getaffinity(0)), spec, dtype(cfg)),
                  "stop_tokens": [] if eos >= cfg.vocab_size else [eos],
                  "top_k": int(settings["top_k"] or 0), "top_p": settings["top_p"],
                  "temperature": settings["temperature"], "cpus": cpus,
                  "xla_cpu_devices": len(jax.devices()), "tunix": _version(),
                  "logits_probe": logits_probe(model, ids)})
  first = call(0)   # compiles; the second call compiles again (Tunix), hence warmup >= 2
  for i in range(spec["warmup"] - 1):
    call(1 + i)
  emit("READY", {})
  i = 0
  while wait_command() == "step":
    emit("STEP", {"tunix": call(100 + i)})
    i += 1
  emit("DONE", {"rss_peak_mb": round(rss_peak_mb(), 1), "first_call_s": {"tunix": first}})


def _version() -> str:
  from importlib.metadata import version

  return version("google-tunix")


def grpo_config(learner, tx_args: dict, spec: dict, cfg) -> dict:
  """Tunix's GRPO configuration in grpo_vs_trl's `COMPARED` vocabulary, read from the
  learner, its cluster's rollout and training configs and the model config; the optimizer
  (an optax chain, opaque) from the arguments it was built with."""
  from tunix.models.qwen2.model import RematConfig

  algo = learner.algo_config
  roll = learner.rl_cluster.cluster_config.rollout_config
  train = learner.rl_cluster.cluster_config.training_config
  eos = int(learner.rl_cluster.rollout.eos_id())
  mini = train.mini_batch_size or spec["prompts"]
  micro = train.train_micro_batch_size or mini
  return {
      "dtype": dtype(cfg), "threads": len(os.sched_getaffinity(0)),
      "prompts": spec["prompts"], "group": algo.num_generations,
      "completions": spec["prompts"] * algo.num_generations,
      "prompt_len": roll.max_prompt_length, "new_tokens": roll.max_tokens_to_generate,
      "stop_tokens": [] if eos >= cfg.vocab_size else [eos],
      "loss_agg": LOSS_AGG.get(algo.loss_agg_mode, f"Tunix {algo.loss_agg_mode}"),
      "eps_low": float(algo.epsilon),
      "eps_high": float(getattr(algo, "epsilon_high", algo.epsilon)),
      "kl_coef": float(algo.beta),
      "advantage": ("group mean, / group std" if algo.advantage_estimator == "grpo"
                    else f"Tunix {algo.advantage_estimator}"),
      "updates_per_rollout": algo.num_iterations * (spec["prompts"] // mini),
      "micro_batches": mini // micro, **tx_args,
      "activation_checkpointing": cfg.remat_config != RematConfig.NONE,
      "old_logp_forward": algo.num_iterations > 1,
      "temperature": float(roll.temperature), "top_p": float(roll.top_p),
      "top_k": int(roll.top_k or 0), "freed_host_memory": spec["freed"],
      # not compared
      "sampler": "vanilla Sampler (static batch), prompts repeated group times",
      "policy_loss": f"{algo.policy_loss_fn} ({algo.loss_algo})", "tunix": _version(),
  }


def grpo_worker(spec: dict) -> None:
  """Tunix's GRPOLearner, one GRPO iteration per "step" command (generation, rewards and
  advantages, one update), then the old-policy log-prob forward on that rollout, timed
  outside the iteration (as rljax's `time_recompute`)."""
  cpus = start(spec)
  import jax
  import optax
  from flax import nnx
  from tunix.rl import rl_cluster as rlc
  from tunix.rl.grpo import grpo_learner
  from tunix.rl.rollout import base_rollout

  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("fsdp", "tp"))
  model, cfg = load(spec["model_dir"], mesh)
  p, n = spec["prompt_len"], spec["new_tokens"]
  tx_args = {"optimizer": "adamw", "lr": spec["lr"], "adam_b1": 0.9, "adam_b2": 0.999,
             "adam_eps": 1e-8, "weight_decay": 0.0, "grad_clip": 1.0}
  tx = optax.chain(optax.clip_by_global_norm(tx_args["grad_clip"]), optax.adamw(
      tx_args["lr"], b1=tx_args["adam_b1"], b2=tx_args["adam_b2"], eps=tx_args["adam_eps"],
      weight_decay=tx_args["weight_decay"]))
  cluster = rlc.RLCluster(actor=model, reference=None, tokenizer=tokenizer(cfg.vocab_size),
                          cluster_config=rlc.ClusterConfig(
      role_to_mesh={r: mesh for r in (rlc.Role.ACTOR, rlc.Role.REFERENCE, rlc.Role.ROLLOUT)},
      rollout_engine="vanilla", offload_to_cpu=False,
      training_config=rlc.RLTrainingConfig(actor_optimizer=tx, eval_every_n_steps=10 ** 9,
                                           max_steps=spec["steps"]),
      rollout_config=base_rollout.RolloutConfig(
          max_tokens_to_generate=n, temperature=1.0, top_p=1.0, top_k=None,
          max_prompt_length=p, kv_cache_size=p + n)))
  algo = grpo_learner.GRPOConfig(num_generations=spec["group"], num_iterations=1, beta=0.0,
                                 epsilon=0.2, loss_agg_mode=TUNIX_AGG[spec["loss_agg"]])
  rng = np.random.default_rng(0)
  learner = grpo_learner.GRPOLearner(
      rl_cluster=cluster, algo_config=algo,
      reward_fns=lambda prompts, completions, **_: [float(x) for x in rng.random(len(prompts))])
  emit("CONFIG", {**grpo_config(learner, tx_args, spec, cfg), "cpus": cpus,
                  "xla_cpu_devices": len(jax.devices())})
  _drive(learner, cluster, nnx)
  ids = prompt_ids(spec["steps"], cfg.vocab_size, prompts=spec["prompts"], prompt_len=p)
  learner.train([{"prompts": np.array(texts(batch))} for batch in ids])
  wait_command()
  emit("DONE", {"rss_peak_mb": round(rss_peak_mb(), 1)})


def _drive(learner, cluster, nnx) -> None:
  """Wraps the learner's rollout and the cluster's update: each iteration waits for the
  parent's "step", is timed, and reports one STEP when its update has finished."""
  import jax

  generate, update = learner._generate_and_compute_advantage, cluster.update_actor
  step = {}
  compiles = [0]   # XLA compilations so far: a timed iteration that compiles is a warm-up
  jax.monitoring.register_event_duration_secs_listener(
      lambda event, _secs, **_: compiles.__setitem__(0, compiles[0] + (event == COMPILE_EVENT)))

  def timed_generate(*args, **kwargs):
    if wait_command() != "step":
      raise RuntimeError("the parent stopped before Tunix's last step")
    step.update(t0=time.perf_counter(), usage=process_usage(), compiles=compiles[0])
    out = generate(*args, **kwargs)
    jax.block_until_ready((out.completion_ids, out.advantages))
    step.update(t1=time.perf_counter(), example=out)
    return out

  def timed_update(*args, **kwargs):
    t2 = time.perf_counter()
    update(*args, **kwargs)
    jax.block_until_ready(nnx.state(cluster.actor_trainer.model))
    t3 = time.perf_counter()
    out = {"generate": step["t1"] - step["t0"], "update": t3 - t2, "total": t3 - step["t0"],
           **usage_since(step["usage"]),
           "tokens": int(np.asarray(step["example"].completion_mask).sum()),
           "optimizer_steps": int(cluster.actor_trainer.train_steps),
           "compiles": compiles[0] - step["compiles"], "rss_mb": round(rss_mb())}
    ex = step["example"]
    jax.block_until_ready(cluster.get_old_per_token_logps(ex.prompt_ids, ex.completion_ids))
    out["old_logp"] = time.perf_counter() - t3
    emit("STEP", out)

  learner._generate_and_compute_advantage = timed_generate
  cluster.update_actor = timed_update
