"""The config's groups besides `algo` (`rljax.train.config.algo`): the run, the model, the
warm start, the optimizer, the mesh, `rljax plan`, the task and sampling. One frozen dataclass
each: fields with their defaults and one-line docs, and the group's own checks."""

from __future__ import annotations

import dataclasses
import re

import jax

from rljax.data.records_task import ANSWER_EXTRACTORS
from rljax.data.samplers import SAMPLERS
from rljax.data.tasks import TASKS
from rljax.models.config import ATTENTION_IMPLEMENTATIONS
from rljax.models.hf import config_from_hf
from rljax.models.lora import TARGETS as LORA_TARGETS
from rljax.models.presets import hf_config_dict
from rljax.train.config.fields import Group, field

DTYPES = ("float32", "bfloat16", "float64")   # float64: with jax_enable_x64 (checked)
SAMPLER_DTYPES = ("", "float32", "bfloat16")
TASK_NAMES = (*TASKS, "jsonl", "hf_dataset", "tfds", "python")


@dataclasses.dataclass(frozen=True)
class RunSpec(Group):
  """Run directory, seed, iteration count, checkpoints, evaluation cadence and logging."""

  SECTION = "run"
  dir: str = field("runs/default", "run directory; resumes from it if it holds checkpoints")
  seed: int = field(0, "seed of the prompts, the warm start and the updates")
  sample_stream: int = field(0, "extra salt of the sampling keys only (an A/A control)")
  iterations: int = field(60, "RL iterations (rollout + update)", ">= 0")
  save_every: int = field(20, "checkpoint every N iterations (0: only at the end)")
  keep_checkpoints: int = field(3, "keep the last K checkpoints", ">= 1")
  eval_every: int = field(10, "held-out evaluation every N iterations (0: only before/after)")
  max_nonfinite_in_row: int = field(3, "stop after K skipped (non-finite) updates in a row",
                                    ">= 1")
  progress: bool = field(True, "tqdm progress bar")
  plots: bool = field(True, "PNG plots at the end of the run")
  tensorboard: bool = field(True, "TensorBoard event files")


@dataclasses.dataclass(frozen=True)
class Model(Group):
  """The policy: `hf_path` loads a local Hugging Face checkpoint, `hf_config` builds random
  weights of a published architecture (a preset of rljax.models.presets or a config.json),
  else the tiny character-level decoder of the fields below; dtypes and remat apply to all."""

  SECTION = "model"
  hf_path: str = field("", "a local Hugging Face checkpoint directory")
  hf_config: str = field("", "a preset name (e.g. 'qwen2.5-7b') or a config.json path")
  vocab_size: int = field(0, "0: the tokenizer's vocabulary size")
  hidden_size: int = field(128, "D, the model width")
  intermediate_size: int = field(384, "the MLP's hidden width")
  num_layers: int = field(3, "decoder blocks")
  num_heads: int = field(4, "H, query heads")
  num_kv_heads: int = field(2, "key/value heads (grouped-query attention)")
  head_dim: int = field(32, "width of one head")
  rope_theta: float = field(10000.0, "RoPE base")
  max_position_embeddings: int = field(256, "position limit (prompt + completion)")
  tie_embeddings: bool = field(False, "the output projection is the embedding")
  dtype: str = field("float32", "compute dtype", DTYPES)
  param_dtype: str = field("float32", "parameter dtype", DTYPES)
  remat: bool = field(False, "recompute each block's activations in the backward pass")
  # xla materialises the [B,H,S,S] scores; chunked, splash (TPU), cudnn (GPU) are linear
  attention: str = field("auto", "rljax.models.attention_kernels", ATTENTION_IMPLEMENTATIONS)
  scan_layers: bool = field(True, "blocks as one scan over stacked parameters (same values)")
  lora_rank: int = field(0, "LoRA rank r (rljax.models.lora)", "int >= 0 (0: full fine-tuning)")
  lora_alpha: float = field(32.0, "LoRA's alpha (the adapters are scaled by alpha / r)")
  lora_targets: tuple[str, ...] = field(list(LORA_TARGETS), "the projections LoRA adapts")
  num_experts: int = field(0, "E, the tiny decoder's routed experts", "int >= 0 (0: dense)")
  num_experts_per_tok: int = field(2, "experts each token is sent to (top-k)")
  moe_intermediate_size: int = field(128, "an expert's hidden width")
  moe_sparse_step: int = field(1, "every N-th layer is a mixture of experts")

  def check(self, c):
    targets = self.lora_targets
    if self.lora_rank:
      c.need(self.lora_alpha > 0, "lora_alpha", "must be > 0")
      c.need(targets and set(targets) <= set(LORA_TARGETS) and len(set(targets)) == len(targets),
             "lora_targets", f"must be some of {list(LORA_TARGETS)}, at least one, no repeats")
    if self.num_experts > 0:
      c.need(1 <= self.num_experts_per_tok <= self.num_experts, "num_experts_per_tok",
             f"must be in [1, model.num_experts={self.num_experts}]")
      c.need(self.moe_intermediate_size >= 1, "moe_intermediate_size", "must be >= 1")
      c.need(self.moe_sparse_step >= 1, "moe_sparse_step", "must be >= 1")
    for name in ("dtype", "param_dtype"):   # JAX would silently compute in float32
      c.need(getattr(self, name) != "float64" or jax.config.jax_enable_x64, name,
             "needs JAX's 64-bit mode (JAX_ENABLE_X64=1 or jax.config.update("
             "'jax_enable_x64', True) before JAX starts)")
    c.need(not (self.hf_path and self.hf_config), "hf_path",
           f"and model.hf_config={self.hf_config!r} are both set: hf_path loads a checkpoint "
           "(with its own config.json), hf_config builds random weights of a preset's or a "
           "config.json's shapes; set one")
    if self.hf_config and not self.hf_path:
      try:
        config_from_hf(hf_config_dict(self.hf_config))
      except ValueError as e:
        c.need(False, "hf_config", f": {e}")


@dataclasses.dataclass(frozen=True)
class SFT(Group):
  """The supervised warm start on generated demonstrations (as R1 does), cached."""

  SECTION = "sft"
  steps: int = field(1000, "optimizer steps")
  batch_size: int = field(32, "demonstrations per step")
  lr: float = field(3e-3, "peak learning rate")
  warmup_steps: int = field(20, "linear warm-up steps")
  end_lr_fraction: float = field(0.1, "cosine decay to lr x this (1.0: constant lr)")
  # the skill phase; the remaining steps follow task.scratchpad_fraction
  worked_steps: int = field(800, "first N steps on worked solutions",
                            ">= 0 (capped at sft.steps)")
  max_len: int = field(48, "demonstration tokens kept", ">= 0 (0: sampling.max_new_tokens)")
  cache_dir: str = field("runs/sft_cache", "where warm starts are cached ('' disables it)")


@dataclasses.dataclass(frozen=True)
class Optim(Group):
  """AdamW for the actor and the critic."""

  SECTION = "optim"
  # with 2 epochs x 4 minibatches: clip fractions 1-3 %; 3e-4 lost accuracy late
  actor_lr: float = field(1e-4, "the policy's learning rate (docs/testbed.md)", "> 0")
  critic_lr: float = field(6e-4, "the critic's learning rate", "> 0")
  warmup_steps: int = field(5, "linear warm-up steps (0: lr from the first step)")
  weight_decay: float = field(0.0, "AdamW's decoupled weight decay")
  b1: float = field(0.9, "Adam's beta1")
  b2: float = field(0.99, "Adam's beta2")
  grad_clip: float = field(1.0, "global gradient-norm clip", ">= 0 (0: off)")


@dataclasses.dataclass(frozen=True)
class Parallel(Group):
  """The device mesh: one size may be -1 (the remaining devices)."""

  SECTION = "parallel"
  data: int = field(-1, "data-parallel size")
  fsdp: int = field(1, "fully sharded data-parallel size")
  tensor: int = field(1, "tensor-parallel size")
  expert: int = field(1, "a MoE policy's experts split over an `expert` axis (1: none)",
                      "int >= 1")
  num_devices: int = field(0, "devices used (per process: an equal share)", "int >= 0 (0: all)")
  sampler_devices: int = field(0, "N: the last N devices sample", "int >= 0 (0: colocated)")
  sampler_tensor: int = field(1, "tensor-parallel size of the sampler's own mesh")

  def check(self, c):
    for name in ("data", "fsdp", "tensor"):
      size = getattr(self, name)
      c.need(isinstance(size, int) and (size >= 1 or size == -1), name,
             "must be an int >= 1, or -1 (the remaining devices)")
    if isinstance(self.sampler_devices, int) and self.sampler_devices > 0:
      c.need(self.sampler_tensor >= 1 and not self.sampler_devices % self.sampler_tensor,
             "sampler_tensor", f"must divide parallel.sampler_devices={self.sampler_devices}")


@dataclasses.dataclass(frozen=True)
class Plan(Group):
  """What `rljax plan` needs beyond the run's own fields."""

  SECTION = "plan"
  prompt_len: int = field(0, "prompt columns P to plan for",
                          "int >= 0 (0: the task's prompt columns)")


@dataclasses.dataclass(frozen=True)
class Task(Group):
  """The task, its data source, prompts and rewards."""

  SECTION = "task"
  name: str = field("arithmetic", "a task of rljax.data.tasks.TASKS or a source", TASK_NAMES)
  difficulty: int = field(1, "lowest difficulty level")
  difficulty_max: int = field(4, "highest level (mixed uniformly); 0: same as difficulty")
  seed: int = field(1234, "seed of the task's prompts")
  heldout_size: int = field(128, "held-out prompts")
  ood_difficulty: int = field(0, "synthetic tasks: also evaluate this level", ">= 0 (0: off)")
  digits: int = field(1, "arithmetic: digits per operand")
  # 0.15: greedy answers tersely and fails, sampling finds the scratchpad ~13 % of the time
  scratchpad_fraction: float = field(0.15, "arithmetic: share of demos with worked steps",
                                     "[0, 1]")
  jsonl_path: str = field("", "name == 'jsonl': rows {prompt, answer[, solution]}")
  hf_path: str = field("", "name == 'hf_dataset': hub name, data file or save_to_disk dir")
  hf_config: str = field("", "hf_dataset: configuration name (GSM8K: 'main')")
  hf_split: str = field("train", "hf_dataset: split, slicing allowed ('train[:1000]')")
  tfds_name: str = field("", "name == 'tfds': 'name[/config][:version]' (array_record)")
  tfds_split: str = field("train", "tfds: split, slicing allowed")
  tfds_data_dir: str = field("", "tfds: directory of prepared datasets ('': TFDS's default)")
  prompt_field: str = field("prompt", "jsonl/hf_dataset/tfds: field of the prompt text")
  answer_field: str = field("answer", "... field of the ground-truth answer")
  solution_field: str = field("solution", "... field of a worked solution (optional)")
  answer_extractor: str = field("none", "none | gsm8k (after '####') | boxed | regex",
                                ANSWER_EXTRACTORS)
  answer_regex: str = field("", "answer_extractor == 'regex': group 1 of the last match")
  prompt_template: str = field("", "'' or text with '{prompt}'")
  chat_template: bool = field(False, "wrap prompts in the HF tokenizer's chat template")
  long_prompts: str = field("reject", "prompts that do not fit", ("reject", "truncate"))
  prompt_sampler: str = field("uniform", "uniform | curriculum | prioritized", SAMPLERS)
  curriculum_steps: int = field(40, "curriculum: iterations from easiest to hardest")
  format_weight: float = field(0.1, "weight of the format reward in the total score")
  reward_on_failure: str = field("score_failure", "a reward fn failed: score_failure | raise",
                                 ("score_failure", "raise"))
  reward_timeout: float = field(10.0, "seconds per reward call (0: no deadline)")
  reward_model_path: str = field("", "a saved reward model (rljax.rewards) ...")
  reward_model_weight: float = field(0.0, "... added to the verifier's score with this weight")
  # fn(prompt, completion, answer) -> float | {"score": ...}; rljax.rewards.user
  reward_fns: tuple[str, ...] = field([], "your rewards: 'module:fn' | 'path/file.py:fn'")
  reward_weights: tuple = field([], "one weight per reward_fns entry ([]: 1.0 each)")
  reward_fns_mode: str = field("replace", "replace the task's verifier in the score | add",
                               ("replace", "add"))
  python: str = field("", "name == 'python': 'module:factory' of your task object")
  # factory(prompt) -> Env; each row keeps its KV cache across turns (rljax.sampling.multiturn)
  env: str = field("", "multi-turn episodes: 'module:factory' | 'file.py:factory'")
  env_timeout: float = field(10.0, "seconds per environment call (0: no deadline)")
  env_reward_only: bool = field(False, "score = the environment's step rewards only")

  def check(self, c):
    c.need(not self.ood_difficulty or self.name in TASKS, "ood_difficulty",
           f"needs a synthetic task ({sorted(TASKS)}), not task.name={self.name!r}")
    for name, source in (("jsonl_path", "jsonl"), ("hf_path", "hf_dataset"),
                         ("tfds_name", "tfds")):
      if self.name == source and not getattr(self, name):
        c.problems.append(f"task.{name} is empty but task.name={source!r}")
    c.need(not self.prompt_template or "{prompt}" in self.prompt_template, "prompt_template",
           "must contain '{prompt}'")
    c.need((self.name == "python") == bool(self.python), "python",
           f"is the task factory of task.name='python' (got task.name={self.name!r}): set both "
           "or neither")
    c.need(not self.env or ":" in self.env, "env",
           ": expected 'module.path:factory' or 'file.py:factory'")
    self._check_rewards(c)

  def _check_rewards(self, c):
    if self.answer_extractor == "regex":
      try:
        groups = re.compile(self.answer_regex).groups if self.answer_regex else 0
        c.need(groups >= 1, "answer_regex", "needs a capture group (answer_extractor='regex')")
      except re.error as e:
        c.need(False, "answer_regex", f"does not compile: {e}")
    fns, weights = self.reward_fns, self.reward_weights
    c.need(all(isinstance(f, str) and ":" in f for f in fns), "reward_fns",
           ": each entry is 'module.path:fn' or 'file.py:fn'")
    if weights and len(weights) != len(fns):
      c.problems.append(f"task.reward_weights has {len(weights)} entries for {len(fns)} "
                        "task.reward_fns (or leave it empty for 1.0 each)")
    c.need(all(isinstance(w, int | float) for w in weights), "reward_weights", "must be numbers")


@dataclasses.dataclass(frozen=True)
class Sampling(Group):
  """Rollout and evaluation sampling."""

  SECTION = "sampling"
  prompts_per_iteration: int = field(16, "prompts per RL iteration", ">= 1")
  n: int = field(8, "G: completions per prompt", ">= 1")
  # 36 binds: 5-term scratchpads reach it, so truncation and the soft overlong buffer act
  max_new_tokens: int = field(36, "T: completion tokens (multi-turn: the episode's budget)",
                              ">= 1")
  temperature: float = field(1.0, "sampling temperature", "> 0")
  top_k: int = field(0, "top-k sampling", ">= 0 (0: off)")
  top_p: float = field(1.0, "nucleus sampling (1: off)", "(0, 1]")
  min_p: float = field(0.0, "min-p sampling (0: off)", "[0, 1)")
  sampler_dtype: str = field("", "the sampler's copy ('': same as training)", SAMPLER_DTYPES)
  # same tokens as the static sampler; slots=0: every row resident, compacted as rows
  # finish; slots < rows: a queue refilling slots (static sampler: waves of `slots` rows)
  continuous: bool = field(True, "continuous batching (rljax.sampling.continuous)")
  slots: int = field(0, "decode slots", "int >= 0 (0: all rows)")
  share_prefill: bool = field(True, "prefill each prompt once for its n samples")
  max_turns: int = field(1, "task.env: turns per episode", "int >= 1")
  max_total_tokens: int = field(0, "task.env: the episode budget",
                                "int >= 0 (0: sampling.max_new_tokens)")
  turn_stop: tuple[str, ...] = field([], "task.env: the strings that end a turn")
  max_observation_tokens: int = field(64, "an observation is cut to this many tokens",
                                      "int >= 0")
  # batch t is sampled by policy version max(0, t - k) (rljax.train.rollout.async_rollouts)
  max_staleness: int = field(0, "asynchronous rollouts k", "int >= 0 (0: synchronous)")
  # a request in flight at a weight handoff continues with the new weights (k + 1 segments)
  partial_rollouts: bool = field(False, "max_staleness > 0: requests span weight versions")
  eval_n: int = field(4, "samples per held-out prompt for pass@k / avg@k", ">= 0")
  eval_temperature: float = field(1.0, "temperature of the held-out samples")
  eval_passk_n: int = field(0, "pass@k up to this k (powers of two), before/after RL (0: off)")
  eval_passk_prompts: int = field(128, "... on this many held-out prompts", ">= 0 (0: all)")

  def check(self, c):
    c.need(self.eval_passk_n == 0 or self.eval_passk_n > self.eval_n, "eval_passk_n",
           f"must be 0 (off) or > sampling.eval_n={self.eval_n}")
    c.need(all(isinstance(x, str) and x for x in self.turn_stop), "turn_stop",
           "must be non-empty strings")
