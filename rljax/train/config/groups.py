"""The config's groups besides `algo` (`rljax.train.config.algo`), one frozen dataclass each:
fields with their defaults and one-line docs, and the group's own checks."""

from __future__ import annotations

import dataclasses
import pathlib
import re

import jax

from rljax.data.tasks import TASKS
from rljax.models.config import ATTENTION_IMPLEMENTATIONS
from rljax.models.hf import config_from_hf
from rljax.models.lora import TARGETS as LORA_TARGETS
from rljax.models.presets import hf_config_dict
from rljax.train.config.fields import Group, field

DTYPES = ("float32", "bfloat16", "float64")   # float64: with jax_enable_x64 (checked)
SAMPLER_DTYPES = ("", "float32", "bfloat16")


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
  num_devices: int = field(0, "devices used (0: all; per process: an equal share)")
  sampler_devices: int = field(0, "N: the last N devices sample", "int >= 0 (0: colocated)")
  sampler_tensor: int = field(1, "tensor-parallel size of the sampler's own mesh")

  def check(self, c):
    if isinstance(self.sampler_devices, int) and self.sampler_devices > 0:
      c.need(self.sampler_tensor >= 1 and not self.sampler_devices % self.sampler_tensor,
             "sampler_tensor", f"must divide parallel.sampler_devices={self.sampler_devices}")


@dataclasses.dataclass(frozen=True)
class Plan(Group):
  """What `rljax plan` needs beyond the run's own fields."""

  SECTION = "plan"
  prompt_len: int = field(0, "prompt columns P to plan for",
                          "int >= 0 (0: the task's prompt columns)")


_SET_NAME = re.compile(r"[A-Za-z0-9_-]+")


@dataclasses.dataclass(frozen=True)
class EvalSetSpec(Group):
  """One named evaluation set of `eval.sets` (`rljax.train.config.eval_set` makes one),
  resolved; the specs hold those other than the run's own `heldout`."""

  SECTION = "eval.sets"
  name: str = field("heldout", "the set's name: `eval/<name>/...` in the logs")
  source: str = field("heldout", "heldout | NAME[:LEVEL] (a synthetic task) | a .jsonl file")
  size: int = field(128, "prompts", "int >= 0 (0: all of the source)")
  greedy: bool = field(True, "also score the greedy completion")
  temperature: float = field(1.0, "sampling temperature of the k samples", "> 0")
  k: int = field(4, "samples per prompt (avg@k, pass@1..k)", "int >= 0 (0: none)")

  @property
  def where(self) -> str:
    return f"eval.sets.{self.name}"

  def check(self, c):
    if not _SET_NAME.fullmatch(self.name):
      c.problems.append(f"{self.where}: a set name is letters, digits, '_' or '-'")
    if not isinstance(self.greedy, bool):
      c.need(False, "greedy", "must be true or false")
    elif not self.greedy and not self.k:
      c.problems.append(f"{self.where}: greedy=False and k=0 evaluate nothing")
    source, name = str(self.source), str(self.source).partition(":")[0]
    level = str(self.source).partition(":")[2]
    if source.endswith(".jsonl"):
      c.need(pathlib.Path(source).is_file(), "source", ": no such JSONL file")
    elif source != "heldout":
      c.need(name in TASKS and (not level or (level.isdigit() and int(level) >= 1)), "source",
             f"is not 'heldout', a synthetic task ({sorted(TASKS)}) with an optional "
             "':LEVEL' >= 1, or a .jsonl file")
