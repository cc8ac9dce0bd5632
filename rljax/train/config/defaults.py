"""The one base config. Experiment files state only what differs from it.

Its field names are the public override API (`--config.algo.eps_high=0.28`). The `algo`
group is in `rljax.train.config.algo_defaults`.
"""

from __future__ import annotations

from ml_collections import ConfigDict

from rljax.models.presets import hf_config_dict
from rljax.train.config.algo_defaults import algo_defaults


def base_config() -> ConfigDict:
  """Every field rljax reads, with defaults for the embedded default run (GRPO)."""
  return ConfigDict(dict(
      run=_run(), model=_model(), task=_task(), sft=_sft(), sampling=_sampling(),
      algo=algo_defaults(), optim=_optim(), parallel=_parallel(), eval=_eval(), plan=_plan()))


EVAL_SET_FIELDS = ("source", "size", "greedy", "temperature", "k")


def eval_set(source: str = "heldout", *, size: int = 128, greedy: bool = True,
             temperature: float = 1.0, k: int = 4) -> ConfigDict:
  """One entry of `eval.sets` (`c.eval.sets.hard = eval_set("arithmetic:5", k=8)`).

  Args:
    source: "heldout" (the task's held-out split) | "NAME" or "NAME:LEVEL" (the held-out
      prompts of a synthetic task, e.g. "arithmetic:5" = 6-term chains) | a JSONL file
      ("*.jsonl", rows {"prompt", "answer"}).
    size: prompts (0: all of the source's; a synthetic task makes `size` held-out prompts,
      0 = task.heldout_size).
    greedy: also score the greedy completion (`accuracy`, `format`, length).
    temperature: sampling temperature of the k samples.
    k: samples per prompt (avg@k, pass@1..k; 0: none).
  """
  return ConfigDict(dict(source=source, size=size, greedy=greedy, temperature=temperature,
                         k=k))


def _eval() -> ConfigDict:
  """Named evaluation sets, each run before RL, every `run.eval_every` iterations and at the
  end, logged as `eval/<name>/...` (result.json: `heldout_<name>/...`). `heldout`, the
  run's own held-out split, keeps its keys: `eval/<metric>` and `heldout_*`."""
  # heldout: size 0 = task.heldout_size prompts; k / temperature None = sampling.eval_n /
  # sampling.eval_temperature
  heldout = ConfigDict(dict(source="heldout", size=0, greedy=True, temperature=None, k=None))
  return ConfigDict(dict(sets=ConfigDict(dict(heldout=heldout))))


def _run() -> ConfigDict:
  """Run directory, seed, iteration count, checkpoints, evaluation and logging."""
  return ConfigDict(dict(
      dir="runs/default",      # run directory; resumes from it if it holds checkpoints
      seed=0,
      # an extra salt of the sampling keys only: two runs with different streams share their
      # SFT start, prompts and update keys but draw independent samples (an A/A control)
      sample_stream=0,
      iterations=60,           # RL iterations (rollout + update)
      save_every=20,           # checkpoint every N iterations (0: only at the end)
      keep_checkpoints=3,      # keep the last K checkpoints
      eval_every=10,           # held-out evaluation every N iterations (0: only before/after)
      progress=True,           # tqdm progress bar
      plots=True,              # PNG plots at the end of the run
      tensorboard=True,
      max_nonfinite_in_row=3,  # stop after K consecutive skipped (non-finite) updates
  ))


def _model() -> ConfigDict:
  """The policy model."""
  # The policy. `hf_path` loads a local Hugging Face checkpoint; `hf_config` builds random
  # weights of a published architecture (a preset of rljax.models.presets, e.g. "qwen2.5-7b",
  # or a config.json path; `rljax plan` reads only its shapes); otherwise a tiny
  # character-level decoder is built from the fields below. dtype, param_dtype and remat
  # apply to all three.
  return ConfigDict(dict(
      hf_path="",
      hf_config="",
      vocab_size=0,            # 0: the tokenizer's vocabulary size
      hidden_size=128,
      intermediate_size=384,
      num_layers=3,
      num_heads=4,
      num_kv_heads=2,
      head_dim=32,
      rope_theta=10000.0,
      max_position_embeddings=256,
      tie_embeddings=False,
      dtype="float32",
      param_dtype="float32",
      remat=False,
      # auto | xla | chunked | splash | cudnn (rljax.models.attention_kernels): xla
      # materialises the [B,H,S,S] scores; chunked (any device), splash (TPU), cudnn (GPU,
      # bf16) are memory-linear; auto: splash on TPU (one device, or under jax.set_mesh),
      # cudnn on GPU, else xla up to 256 x 256 query x key pairs per row, chunked beyond
      attention="auto",
      # the decoder blocks as one scan over stacked parameters (compile time flat in
      # depth); False: one module per block (rljax.models.stack; same values)
      scan_layers=True,
      # LoRA (rljax.models.lora): 0 = full fine-tuning; r > 0 trains fp32 adapters on
      # lora_targets only (the base stays frozen, the reference is the base: no second copy)
      lora_rank=0,
      lora_alpha=32.0,
      lora_targets=["q", "k", "v", "o", "gate", "up", "down"],
      # the tiny decoder's experts (rljax.models.moe): 0 = dense; E > 0: every moe_sparse_step-th
      # layer sends each token to its top num_experts_per_tok of E experts (Qwen3-MoE's block)
      num_experts=0, num_experts_per_tok=2, moe_intermediate_size=128, moe_sparse_step=1,
  ))


def _task() -> ConfigDict:
  """The task, its data source, prompts and rewards."""
  return ConfigDict(dict(
      name="arithmetic",       # see rljax.data.tasks.TASKS
      difficulty=1,            # lowest difficulty level
      difficulty_max=4,        # highest level (levels mixed uniformly); 0: same as difficulty
      seed=1234,
      heldout_size=128,
      ood_difficulty=0,        # arithmetic/countdown: also evaluate held-out prompts of this
                               # level before/after RL (0: off), e.g. 5 = more terms than trained
      digits=1,                # arithmetic: digits per operand
      # arithmetic: share of prompts whose SFT demonstration shows the worked steps; the rest
      # are answer-only. 0.15: the "rare scratchpad" start (greedy answers tersely and fails,
      # sampling finds the reliable scratchpad ~13 % of the time); 1.0: every demo worked.
      scratchpad_fraction=0.15,
      jsonl_path="",           # for name == "jsonl": rows {"prompt", "answer"[, "solution"]}
      hf_path="",              # for name == "hf_dataset": hub name, data file or save_to_disk dir
      hf_config="",            # hf_dataset: configuration name (GSM8K: "main"); "" for none
      hf_split="train",        # hf_dataset: split, slicing allowed ("train[:1000]")
      tfds_name="",            # for name == "tfds": "name[/config][:version]" (array_record)
      tfds_split="train",      # tfds: split, slicing allowed
      tfds_data_dir="",        # tfds: directory of prepared datasets; "" for TFDS's default
      prompt_field="prompt",   # jsonl/hf_dataset/tfds: field of the prompt text
      answer_field="answer",   # ... field of the ground-truth answer
      solution_field="solution",  # ... field of a worked solution (SFT demonstration), optional
      answer_extractor="none",  # none | gsm8k (after "####") | boxed (last \boxed{}) | regex
      answer_regex="",         # answer_extractor == "regex": pattern, group 1 of the last match
      prompt_template="",      # "" or text with "{prompt}", e.g. "{prompt}\nEnd with <answer>"
      chat_template=False,     # wrap prompts in the HF tokenizer's chat template (instruct models)
      long_prompts="reject",   # reject | truncate (keep the last tokens) prompts that do not fit
      prompt_sampler="uniform",  # uniform | curriculum | prioritized
      curriculum_steps=40,     # curriculum: iterations to move from easiest to hardest
      format_weight=0.1,       # weight of the format reward in the total score
      reward_on_failure="score_failure",  # score_failure | raise (reward fn raised/hung/NaN)
      reward_timeout=10.0,     # seconds per reward call (0: no deadline)
      reward_model_path="",    # a saved reward model (rljax.rewards.save_reward_model) ...
      reward_model_weight=0.0,  # ... added to the verifier's score with this weight
      # your own rewards: ["module:fn" | "path/file.py:fn", ...], fn(prompt, completion,
      # answer) -> float | {"score": ...}; `fn.batched = True` takes lists (rljax.rewards.user)
      reward_fns=[],
      reward_weights=[],       # one per reward_fns entry ([]: 1.0 each)
      reward_fns_mode="replace",  # replace the task's verifier in the score | add to it
      python="",               # for name == "python": "module:factory" of your task object
      # multi-turn episodes (rljax.envs): "module:factory" | "file.py:factory", factory(prompt)
      # -> Env; the rollout keeps each row's KV cache across turns (rljax.sampling.multiturn)
      env="",
      env_timeout=10.0,        # seconds per environment call (0: no deadline)
      env_reward_only=False,   # score = the environment's step rewards only (no verifier)
  ))


def _sft() -> ConfigDict:
  """The supervised warm start."""
  # Supervised cold start on generated demonstrations (as R1 does), cached per run dir.
  return ConfigDict(dict(
      steps=1000,
      batch_size=32,
      lr=3e-3,
      warmup_steps=20,
      end_lr_fraction=0.1,   # cosine decay to lr x this after warm-up (1.0: constant lr)
      # first N steps on every prompt's worked solution (arithmetic): the skill phase; the
      # remaining steps follow task.scratchpad_fraction (the terse-answer phase)
      worked_steps=800,        # (capped at steps)
      max_len=48,            # demonstration tokens kept (0: sampling.max_new_tokens)
      cache_dir="runs/sft_cache",  # "" disables caching
  ))


def _sampling() -> ConfigDict:
  """Rollout and evaluation sampling."""
  return ConfigDict(dict(
      prompts_per_iteration=16,
      n=8,                     # G: completions per prompt
      # 36 binds: 5-term scratchpads (mean 32 tokens + eos) reach it, so truncation and
      # the soft overlong buffer (algo.overlong_cache_len) act
      max_new_tokens=36,
      temperature=1.0,
      top_k=0,
      top_p=1.0,
      min_p=0.0,
      sampler_dtype="",        # "" (same as training) or "bfloat16": a real train-inference gap
      # continuous batching (rljax.sampling.continuous): same tokens as the static sampler,
      # request by request. slots=0: every row resident, moved onto half as many slots each
      # time half have finished (long tails stop costing a full batch); slots < rows: a
      # queue of requests refilling slots as they free. The static sampler (continuous=False)
      # with slots < rows decodes the rows in waves of `slots` rows (a multiple of the batch
      # shards dividing the rows): only one wave's KV cache is resident
      continuous=True,
      slots=0,
      share_prefill=True,      # prefill each prompt once for its n samples (both samplers)
      # with task.env: max_new_tokens is the whole episode's budget (sampled + observation
      # tokens; a turn gets what remains); a turn ends at a turn_stop string
      max_turns=1,
      max_total_tokens=0,    # with task.env: the episode budget; 0 = max_new_tokens (set:
                             # it becomes max_new_tokens, the rows' completion columns)
      turn_stop=[],
      max_observation_tokens=64,  # an observation is cut to this many tokens
      # asynchronous rollouts: batch t is sampled by policy version max(0, t - k) while the
      # trainer updates (0: the synchronous loop); rljax.train.run.async_rollouts
      max_staleness=0,
      # with max_staleness = k > 0: a request in flight at a weight handoff continues with
      # the new weights (the completion in k + 1 segments, segment s by version t - k + s);
      # rljax.train.rollout.partial
      partial_rollouts=False,
      eval_n=4,                # samples per held-out prompt for pass@k / avg@k
      eval_temperature=1.0,
      # pass@k for large k (powers of two up to eval_passk_n) on the first
      # eval_passk_prompts held-out prompts, before and after RL (0: off)
      eval_passk_n=0,
      eval_passk_prompts=128,
  ))


def _optim() -> ConfigDict:
  """AdamW for the actor and the critic."""
  return ConfigDict(dict(
      # 1e-4 with 2 epochs x 4 minibatches: upper/lower clip fractions 1-3 % while the
      # policy moves, held-out greedy +80 points; 3e-4 lost accuracy late (docs/testbed.md)
      actor_lr=1e-4,
      critic_lr=6e-4,
      warmup_steps=5,
      weight_decay=0.0,
      b1=0.9,
      b2=0.99,
      grad_clip=1.0,
  ))


def _parallel() -> ConfigDict:
  """The device mesh."""
  # Mesh over `num_devices` devices (0: all; several processes: an equal share of each one's
  # own, `parallel.select_devices`); one size may be -1 (the rest). sampler_devices: 0 = the
  # sampler shares the trainer's devices; N > 0 = the last N devices (evenly from every process)
  # sample on their own mesh (data x sampler_tensor), the others train (weights resharded after
  # updates). expert: a MoE policy's experts split over an `expert` mesh axis (1: none).
  return ConfigDict(dict(data=-1, fsdp=1, tensor=1, expert=1, num_devices=0, sampler_devices=0,
                         sampler_tensor=1))


def _plan() -> ConfigDict:
  """What `rljax plan` needs beyond the run's own fields."""
  # prompt_len: prompt columns P to plan for (0: the task's, as `rljax train` computes them
  # from its prompts and tokenizer; set it when the plan host cannot load the data)
  return ConfigDict(dict(prompt_len=0))


def resolved_eval_sets(config) -> dict:
  """{name: {source, size, greedy, temperature, k}} of `eval.sets`: fields an entry leaves
  out take `eval_set()`'s defaults, and the `heldout` entry's None k / temperature are
  `sampling.eval_n` / `sampling.eval_temperature`. Derived here once; nothing is written back."""
  out = {}
  for name, entry in config.eval.sets.items():
    fields = dict(eval_set().to_dict(), **(entry.to_dict() if hasattr(entry, "to_dict") else {}))
    if fields["k"] is None:
      fields["k"] = config.sampling.eval_n
    if fields["temperature"] is None:
      fields["temperature"] = config.sampling.eval_temperature
    out[name] = fields
  return out


def distill_teacher_dir(config) -> str:
  """`algo.distill_teacher` with "{seed}" replaced by `run.seed` ("" when off)."""
  return str(config.algo.distill_teacher).replace("{seed}", str(config.run.seed))


def model_positions(config) -> int:
  """The policy's position limit: the `max_position_embeddings` of `model.hf_config` (a
  preset or a config.json) or of `model.hf_path`'s config.json when set and readable
  (validation reports an unreadable hf_config), else `model.max_position_embeddings`."""
  source = config.model.hf_config or config.model.hf_path
  if source:
    try:
      return int(hf_config_dict(source).get("max_position_embeddings", 4096))
    except ValueError:
      pass
  return int(config.model.max_position_embeddings)


def completion_columns(config) -> int:
  """T, the rollout rows' completion columns: `sampling.max_total_tokens` (the whole
  episode: sampled and observation tokens) for a multi-turn run that sets it, else
  `sampling.max_new_tokens`. The one derived length; nothing writes it back."""
  s = config.sampling
  if config.task.env and s.max_total_tokens > 0:
    return int(s.max_total_tokens)
  return int(s.max_new_tokens)
