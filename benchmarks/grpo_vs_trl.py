"""One GRPO iteration: rljax vs TRL `GRPOTrainer` on the same tiny Qwen2 and the same work.

Workload (../shared/PERF_NOTES.md): Qwen2 layout, vocab 512, width 256, MLP 768, 4 layers,
4 query heads x 64, 2 KV heads, untied lm head, rope θ 1e4, random weights built with
torch from a fixed seed, saved with `save_pretrained` and loaded into rljax with
`rljax.models.load_hf`. One step = 8 prompts of 32 tokens x 8 generations = 64
completions of exactly 96 tokens (no early stop), random rewards, GRPO advantages, one
AdamW update (lr 1e-5, grad-norm clip 1.0), no reference model (beta 0), one process on
the CPU. Both frameworks see the same prompt token ids: TRL gets them as strings of 32
space-separated words over a 512-word `WordLevel` tokenizer.

rljax is timed piece by piece with the trainer's own pieces, exactly as
`rljax.train.iteration.rl_iteration` runs them with `algo.old_logp_source="update"`
(rollout -> host rows -> advantages -> one jitted `update_step` whose forward pass also
gives the old log-probs, under stop-gradient):

  generate : `rljax.sampling.generate` (prefill + `lax.while_loop` decode) + copy to host
  update   : `update.build_update_step` (fwd+bwd+AdamW, lm head on completion positions)
  old_logp : timed separately, not part of the step: the no-grad forward over the rollout
             (`objective.policy_forward`) that the default `old_logp_source="recompute"` adds

TRL is timed with a trainer callback (step begin -> step end, optimizer step included)
and a wrapper around `_generate_and_score_completions` (generation + reward + advantages);
`train = step - generate`. With `beta=0`, one iteration and no vLLM, TRL skips the
old-log-prob forward too (it uses the detached log-probs of the loss forward), so both
sides do the same work; "with recompute" adds rljax's separate forward pass.

    python benchmarks/grpo_vs_trl.py [--reps 6] [--warmup 2] [--torch-threads N] [--longtail]

rljax runs the trainer's sampler defaults: continuous batching with every row resident
and one prefill per prompt (`sampling.continuous`, `share_prefill`). With `--longtail`
its update runs on packed rows (`algo.pack_sequences=True`); on the uniform workload,
where every completion has 96 tokens and there is no padding to skip, on the padded
layout (the trainer's default). `--longtail`: completions stop at any of 10 of the 512 ids, up
to 256 tokens (near-uniform random model: geometric lengths, mean ~45); TRL pads every
completion to the longest, rljax computes none of the padding.

The machine is shared: the load average is recorded, and `ratio_vs_reference` compares
rljax with TRL's idle-machine figure from PERF_NOTES (3.08 s per step). torch's OpenMP
threads degrade badly on oversubscribed cores; `--torch-threads 1` shows TRL without that.

Last line: RESULT {"metric": "grpo_step_seconds", "rljax": ..., "peer": ..., "ratio": ...}
with ratio = peer / rljax (> 1: rljax is faster).
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

PROMPTS, GROUP, PROMPT_LEN, NEW_TOKENS, LR = 8, 8, 32, 96, 1e-5
HF_CONFIG = dict(vocab_size=512, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                 max_position_embeddings=512, rope_theta=10000.0, tie_word_embeddings=False,
                 rms_norm_eps=1e-6)
PEER_REFERENCE_S = 3.08   # PERF_NOTES: TRL 1.16 GRPOTrainer, idle machine, seconds per step
# --longtail: up to 256 new tokens, stopping at any of 10 of the 512 ids; the random model's
# next-token distribution is near uniform, so lengths are geometric (mean ~45, max ~256)
LONGTAIL_TOKENS, LONGTAIL_STOPS = 256, tuple(range(2, 12))


def build_hf(seed: int = 0, **overrides):
  """The random-weight Qwen2 built with torch from a fixed seed."""
  import torch
  import transformers

  torch.manual_seed(seed)
  cfg = transformers.Qwen2Config(**{**HF_CONFIG, **overrides})
  return transformers.Qwen2ForCausalLM(cfg)


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


# ----------------------------------------------------------------------------- rljax
class RljaxGRPO:
  """The trainer's pieces for one GRPO iteration on fixed shapes (no task, no tokenizer)."""

  def __init__(self, model, *, group=GROUP, new_tokens=NEW_TOKENS, stop_tokens=(), pack=False):
    from flax import nnx

    from rljax import parallel
    from rljax.sampling import SamplingParams
    from rljax.train import objective, update
    from rljax.train.config import base_config

    c = base_config()
    c.sampling.n, c.sampling.max_new_tokens = group, new_tokens
    c.algo.old_logp_source = "update"   # as TRL with one update per rollout
    c.optim.update(actor_lr=LR, warmup_steps=0, weight_decay=0.0, b1=0.9, b2=0.999,
                   grad_clip=1.0)   # TRL / transformers AdamW defaults
    self.group, self.new_tokens, self.pack = group, new_tokens, pack
    self.sampling = SamplingParams(max_new_tokens=new_tokens, n=group,
                                   stop_tokens=tuple(stop_tokens))
    self.mesh = parallel.make_mesh(data=-1, fsdp=1, tensor=1, devices=jax.devices()[:1])
    parallel.shard_model(model, self.mesh)
    graphdef, params = nnx.split(model)
    self.merge = lambda: nnx.merge(graphdef, self.state.actor)   # as rljax.train.loop does
    groups = 1 if pack else 0   # packed rows (algo.pack_sequences) or the padded layout
    spec = objective.loss_spec(c, pack_groups=groups)
    tx = update.make_optimizer(LR, warmup_steps=0, weight_decay=0.0, b1=0.9, b2=0.999,
                               grad_clip=1.0)
    state = update.TrainState(
        step=jnp.zeros((), jnp.int32), iteration=jnp.zeros((), jnp.int32), actor=params,
        actor_opt=update.init_optimizer_state(tx, params), critic=None, critic_opt=None,
        ref=None, kl_coef=jnp.zeros(()), rng=jax.random.key_data(jax.random.key(0)),
        skipped_updates=jnp.zeros((), jnp.int32), nonfinite_in_row=jnp.zeros((), jnp.int32))
    self.state = update.place_state(state, self.mesh)
    shardings = jax.tree.map(lambda x: x.sharding, self.state)
    self.update_step = update.build_update_step(spec, graphdef, None, tx, tx, 1,
                                                state_shardings=shardings, mesh=self.mesh)
    self.policy_stats = jax.jit(lambda p, b: objective.policy_forward(
        nnx.merge(graphdef, p), b, temperature=spec.temperature, pack_groups=groups))

  def rollout(self, prompts, seed):
    """The trainer's default sampler: continuous batching with every row resident and
    one prefill per prompt for its samples (`sampling.continuous`, `share_prefill`)."""
    from rljax.sampling.continuous import generate_continuous

    out = generate_continuous(self.merge(), prompts, np.ones_like(prompts),
                              sampling=self.sampling, rng=jax.random.key(seed),
                              slots=prompts.shape[0] * self.group, share_prefill=True)
    rows = {"prompt_tokens": np.asarray(out.prompt_tokens),
            "prompt_mask": np.asarray(out.prompt_mask), "tokens": np.asarray(out.tokens),
            "mask": np.asarray(out.mask), "sampler_logp": np.asarray(out.logp, np.float32)}
    if not self.sampling.stop_tokens:
      assert rows["mask"].sum() == prompts.shape[0] * self.group * self.new_tokens
    return rows

  def minibatch(self, rows, seed):
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
    from rljax.train import packing
    layout = packing.pack_layout(rows["prompt_mask"].sum(1), rows["mask"].sum(1),
                                 prompt_width=rows["prompt_mask"].shape[1],
                                 completion_width=rows["mask"].shape[1], groups=1)
    packed = {k: jax.device_put(v, sh) for k, v in packing.layout_arrays(layout).items()}
    seq.update(packed)
    mb.update(packed)
    return seq, mb

  def iteration(self, prompts, seed):
    """One timed iteration: {"generate": s, "update": s, "total": s, "old_logp": s}
    (old_logp: the recompute forward, timed after the step and not part of its total)."""
    t0 = time.perf_counter()
    rows = self.rollout(prompts, seed)
    t1 = time.perf_counter()
    seq, mb = self.minibatch(rows, seed)
    mb["old_logp"] = mb["ref_logp"] = jnp.zeros(rows["mask"].shape, jnp.float32)  # unused
    self.state, metrics = self.update_step(self.state, mb, jnp.asarray(True))
    float(metrics["loss"])
    t2 = time.perf_counter()
    jax.block_until_ready(self.policy_stats(self.state.actor, seq))
    t3 = time.perf_counter()
    return {"generate": t1 - t0, "update": t2 - t1, "total": t2 - t0, "old_logp": t3 - t2}


def prompt_ids(steps: int, vocab: int, seed: int = 0) -> np.ndarray:
  """[steps, PROMPTS, PROMPT_LEN] token ids in [2, vocab) (0 = pad, 1 = eos)."""
  return np.random.default_rng(seed).integers(2, vocab, (steps, PROMPTS, PROMPT_LEN))


def warm_rljax(ids: np.ndarray, warmup: int, longtail: bool) -> RljaxGRPO:
  model, _ = load_into_rljax(build_hf())
  grpo = (RljaxGRPO(model, new_tokens=LONGTAIL_TOKENS, stop_tokens=LONGTAIL_STOPS,
                     pack=True)
          if longtail else RljaxGRPO(model))
  t0 = time.perf_counter()
  grpo.iteration(ids[0], 0)
  print(f"rljax first iteration (compiles) {time.perf_counter() - t0:.1f} s", flush=True)
  for i in range(1, warmup):
    grpo.iteration(ids[i % len(ids)], i)
  return grpo


def time_rljax(grpo: RljaxGRPO, ids: np.ndarray, seed0: int) -> list[dict]:
  out = []
  for i in range(len(ids)):
    r = grpo.iteration(ids[i], seed0 + i)
    r["recompute_total"] = r["total"] + r["old_logp"]
    out.append(r)
    print("rljax step " + " ".join(f"{k} {v:.2f}s" for k, v in r.items()), flush=True)
  return out


# ----------------------------------------------------------------------------- TRL
def time_trl(ids: np.ndarray, warmup: int, longtail: bool = False) -> list[dict]:
  import datasets
  import transformers
  import trl

  tokenizer = word_tokenizer(HF_CONFIG["vocab_size"])
  flat = ids.reshape(-1, PROMPT_LEN)
  texts = [" ".join(f"t{int(t)}" for t in row) for row in flat]
  assert tokenizer(texts[0])["input_ids"] == [int(t) for t in flat[0]]
  steps = len(ids)
  rng = np.random.default_rng(0)

  def reward(completions, **_):
    return [float(x) for x in rng.random(len(completions))]

  args = trl.GRPOConfig(
      output_dir=tempfile.mkdtemp(prefix="trl_bench_"), use_cpu=True, report_to="none",
      save_strategy="no", logging_strategy="no", disable_tqdm=True, max_steps=steps,
      per_device_train_batch_size=PROMPTS * GROUP, gradient_accumulation_steps=1,
      num_generations=GROUP, max_completion_length=LONGTAIL_TOKENS if longtail else NEW_TOKENS,
      learning_rate=LR,
      lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
      beta=0.0, use_vllm=False, temperature=1.0, top_p=1.0, top_k=0, seed=0,
      generation_kwargs=({"eos_token_id": list(LONGTAIL_STOPS)} if longtail
                         else {"min_new_tokens": NEW_TOKENS}),
      shuffle_dataset=False, dataloader_num_workers=0)
  gen_times, step_times = [], []

  class Timed(trl.GRPOTrainer):
    def _generate_and_score_completions(self, *a, **k):
      t0 = time.perf_counter()
      out = super()._generate_and_score_completions(*a, **k)
      gen_times.append(time.perf_counter() - t0)
      lengths = out["completion_mask"].sum(dim=1)
      if not longtail:
        assert int(lengths.min()) == NEW_TOKENS == int(lengths.max()), lengths
      return out

  class StepClock(transformers.TrainerCallback):
    def on_step_begin(self, *_, **__):
      self.t0 = time.perf_counter()

    def on_step_end(self, *_, **__):
      step_times.append(time.perf_counter() - self.t0)
      print(f"TRL step {len(step_times)}: {step_times[-1]:.2f}s (generate {gen_times[-1]:.2f}s)",
            flush=True)

  trainer = Timed(model=build_hf(), reward_funcs=reward, args=args,
                  train_dataset=datasets.Dataset.from_list([{"prompt": t} for t in texts]),
                  processing_class=tokenizer, callbacks=[StepClock()])
  trainer.train()
  assert len(step_times) == steps == len(gen_times), (len(step_times), len(gen_times))
  return [{"generate": g, "train": s - g, "total": s}
          for g, s in zip(gen_times[warmup:], step_times[warmup:])]


# ----------------------------------------------------------------------------- report
def med(rows, key):
  return statistics.median(r[key] for r in rows)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--reps", type=int, default=6, help="timed steps per framework")
  parser.add_argument("--warmup", type=int, default=2)
  parser.add_argument("--torch-threads", type=int, default=0,
                      help="0: torch's default; 1 avoids OpenMP collapse on an oversubscribed machine")
  parser.add_argument("--longtail", action="store_true",
                      help="completions stop at 10 stop ids within 256 tokens (long-tailed lengths)")
  args = parser.parse_args()
  import torch
  import trl

  if args.torch_threads:
    torch.set_num_threads(args.torch_threads)

  load_before = os.getloadavg()
  ids = prompt_ids(args.warmup + args.reps, HF_CONFIG["vocab_size"])
  half = args.reps // 2
  # rljax before and after TRL, so both see a similar share of the (shared) machine.
  grpo = warm_rljax(ids, args.warmup, args.longtail)
  rl = time_rljax(grpo, ids[args.warmup:args.warmup + half], seed0=100)
  peer = time_trl(ids, args.warmup, args.longtail)
  rl += time_rljax(grpo, ids[args.warmup + half:], seed0=1000)
  load_after = os.getloadavg()

  r_tot, p_tot = med(rl, "total"), med(peer, "total")
  r_train = med(rl, "update")
  res = {
      "metric": "grpo_step_seconds_longtail" if args.longtail else "grpo_step_seconds",
      "rljax": round(r_tot, 3), "peer": round(p_tot, 3),
      "ratio": round(p_tot / r_tot, 3),
      "rljax_generate": round(med(rl, "generate"), 3),
      "rljax_old_logp": round(med(rl, "old_logp"), 3),
      "rljax_update": round(med(rl, "update"), 3),
      "rljax_with_recompute": round(med(rl, "recompute_total"), 3),
      "peer_generate": round(med(peer, "generate"), 3), "peer_train": round(med(peer, "train"), 3),
      "ratio_generate": round(med(peer, "generate") / med(rl, "generate"), 3),
      "ratio_train": round(med(peer, "train") / r_train, 3),
      "ratio_with_recompute": round(p_tot / med(rl, "recompute_total"), 3),
      "rljax_min_max": [round(min(r["total"] for r in rl), 2), round(max(r["total"] for r in rl), 2)],
      "peer_min_max": [round(min(r["total"] for r in peer), 2),
                       round(max(r["total"] for r in peer), 2)],
      "peer_reference": PEER_REFERENCE_S, "ratio_vs_reference": round(PEER_REFERENCE_S / r_tot, 3),
      "trl_version": trl.__version__, "torch_threads": torch.get_num_threads(), "reps": args.reps,
      "loadavg_before": [round(x, 2) for x in load_before],
      "loadavg_after": [round(x, 2) for x in load_after],
  }
  print(f"\nmedians over {args.reps} steps each (load average {load_before[0]:.1f} -> "
        f"{load_after[0]:.1f} on {os.cpu_count()} cores), TRL {trl.__version__}")
  print(f"  rljax  total {r_tot:6.2f} s = generate {res['rljax_generate']:.2f} + update "
        f"{res['rljax_update']:.2f}  (old_logp_source='recompute' adds {res['rljax_old_logp']:.2f})")
  print(f"  TRL    total {p_tot:6.2f} s = generate {res['peer_generate']:.2f} + train "
        f"{res['peer_train']:.2f}")
  print(f"  ratio (TRL / rljax): end-to-end {res['ratio']:.2f}x, generate "
        f"{res['ratio_generate']:.2f}x, train {res['ratio_train']:.2f}x, "
        f"with the recompute forward {res['ratio_with_recompute']:.2f}x")
  print("RESULT " + json.dumps(res))


if __name__ == "__main__":
  main()
