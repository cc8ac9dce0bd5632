"""Frozen configuration of a decoder-only transformer (Llama / Qwen2 / Qwen3 families)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp

ARCHITECTURES = ("llama", "qwen2", "qwen3")
# ModelConfig.attention (`rljax.models.attention_kernels`)
ATTENTION_IMPLEMENTATIONS = ("auto", "xla", "chunked", "splash", "cudnn")


@dataclasses.dataclass(frozen=True)
class RopeScaling:
  """Llama-3 RoPE frequency scaling ("llama3" rope type in `transformers`).

  Attributes:
    factor: divide the low frequencies by this factor.
    low_freq_factor: wavelengths above `original_max_position_embeddings / low_freq_factor`
      are scaled fully.
    high_freq_factor: wavelengths below `original_max_position_embeddings / high_freq_factor`
      are kept; in between they are interpolated smoothly.
    original_max_position_embeddings: context length of the pre-training run.
  """

  factor: float = 8.0
  low_freq_factor: float = 1.0
  high_freq_factor: float = 4.0
  original_max_position_embeddings: int = 8192


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Hyper-parameters of `Decoder`. Frozen and hashable, so it can be a static jit argument.

  Attributes:
    vocab_size: V.
    hidden_size: model width D.
    intermediate_size: SwiGLU MLP width F.
    num_layers: number of decoder blocks L.
    num_heads: query heads H.
    num_kv_heads: key/value heads K (K == H: MHA, 1 < K < H: GQA, K == 1: MQA).
    head_dim: Dh (may differ from D / H, as in Qwen3).
    rms_norm_eps: epsilon of every RMSNorm.
    rope_theta: RoPE base.
    rope_scaling: None or Llama-3 scaling (a `RopeScaling` or a dict with its fields).
    attention_bias: bias on the q/k/v projections (Qwen2: True).
    attention_out_bias: bias on the output projection (Llama/Qwen3 with attention_bias).
    qk_norm: RMSNorm over Dh on queries and keys before RoPE (Qwen3).
    tie_embeddings: lm head shares the token embedding matrix.
    max_position_embeddings: informational (exported to config.json).
    arch: "llama", "qwen2" or "qwen3" (decides the Hugging Face export layout).
    dtype: compute dtype name ("float32" or "bfloat16").
    param_dtype: parameter storage dtype name.
    remat: rematerialise each decoder block in the backward pass (`nnx.remat`).
    attention: "auto" | "xla" | "chunked" | "splash" | "cudnn": how attention over more
      than one query runs (`rljax.models.attention_kernels`): xla materialises the scores;
      chunked (any device), splash (TPU) and cudnn (GPU) need memory linear in the length;
      auto picks by platform and length (xla for short rows on CPU: today's numbers).
    remat: rematerialise each decoder block in the backward pass (`jax.checkpoint`).
    scan_layers: hold the L identical blocks as one `rljax.models.stack.LayerStack`
      (parameters stacked on a leading "layers" axis) and run them as one `jax.lax.scan`,
      so compile time stays flat in depth; False: one module per block, a Python loop
      (same values and Hugging Face names; its parameter paths are `layers/<i>/...`).
    bos_token_id, eos_token_id, pad_token_id: carried through to / from config.json.
    num_experts: routed experts E of a mixture-of-experts MLP (`rljax.models.moe`); 0: every
      layer is dense. Names as in `transformers`' Qwen3MoeConfig / Qwen2MoeConfig.
    num_experts_per_tok: experts k each token is routed to (top-k).
    moe_intermediate_size: SwiGLU width of each routed expert.
    norm_topk_prob: renormalise the k routing weights to sum to 1 (Qwen3-MoE checkpoints: True).
    decoder_sparse_step: layer i is a MoE layer when (i + 1) % decoder_sparse_step == 0 ...
    mlp_only_layers: ... and i is not listed here (those keep the dense MLP).
    shared_expert_intermediate_size: width of a Qwen2-MoE shared expert (always applied, scaled
      by a sigmoid gate); 0: none.
  """

  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int | None = None
  head_dim: int | None = None
  rms_norm_eps: float = 1e-6
  rope_theta: float = 10000.0
  rope_scaling: RopeScaling | None = None
  attention_bias: bool = False
  attention_out_bias: bool = False
  qk_norm: bool = False
  tie_embeddings: bool = False
  max_position_embeddings: int = 4096
  arch: str = "qwen2"
  dtype: str = "float32"
  param_dtype: str = "float32"
  remat: bool = False
  attention: str = "auto"
  # not in the repr: a layout of the same model (same values, same HF tensors), so text
  # keys made from the repr (the SFT warm-start cache) are shared by both layouts
  scan_layers: bool = dataclasses.field(default=True, repr=False)
  bos_token_id: int | None = None
  eos_token_id: int | tuple[int, ...] | None = None
  pad_token_id: int | None = None
  num_experts: int = 0
  num_experts_per_tok: int = 0
  moe_intermediate_size: int = 0
  norm_topk_prob: bool = False
  decoder_sparse_step: int = 1
  mlp_only_layers: tuple[int, ...] = ()
  shared_expert_intermediate_size: int = 0

  def __post_init__(self):
    if self.num_kv_heads is None:
      object.__setattr__(self, "num_kv_heads", self.num_heads)
    if self.head_dim is None:
      object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
    if isinstance(self.rope_scaling, Mapping):
      object.__setattr__(self, "rope_scaling", _rope_scaling_from_dict(self.rope_scaling))
    if isinstance(self.eos_token_id, list):
      object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))
    if self.arch not in ARCHITECTURES:
      raise ValueError(f"ModelConfig.arch={self.arch!r}; allowed: {ARCHITECTURES}")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(
          f"ModelConfig.num_heads={self.num_heads} is not a multiple of "
          f"num_kv_heads={self.num_kv_heads}")
    if self.head_dim % 2:
      raise ValueError(f"ModelConfig.head_dim={self.head_dim} must be even for RoPE")
    if self.attention not in ATTENTION_IMPLEMENTATIONS:
      raise ValueError(f"ModelConfig.attention={self.attention!r}; allowed: "
                       f"{ATTENTION_IMPLEMENTATIONS}")
    for name in ("dtype", "param_dtype"):
      try:
        object.__setattr__(self, name, jnp.dtype(getattr(self, name)).name)
      except TypeError as e:
        raise ValueError(f"ModelConfig.{name}={getattr(self, name)!r} is not a dtype") from e
    object.__setattr__(self, "mlp_only_layers", tuple(self.mlp_only_layers))
    _check_moe(self)

  def is_moe_layer(self, i: int) -> bool:
    """Whether decoder layer `i` has a mixture-of-experts MLP (the rule of `transformers`'
    Qwen3MoeDecoderLayer: experts present, every `decoder_sparse_step`-th layer, not listed
    in `mlp_only_layers`)."""
    return (self.num_experts > 0 and (i + 1) % self.decoder_sparse_step == 0
            and i not in self.mlp_only_layers)

  @property
  def compute_dtype(self) -> jnp.dtype:
    return jnp.dtype(self.dtype)

  @property
  def weight_dtype(self) -> jnp.dtype:
    return jnp.dtype(self.param_dtype)

  def replace(self, **changes: Any) -> ModelConfig:
    """Returns a copy with `changes` applied (the config itself is never mutated)."""
    return dataclasses.replace(self, **changes)


def _check_moe(cfg: ModelConfig) -> None:
  """Raises ValueError naming the mixture-of-experts field that is out of range."""
  if cfg.num_experts < 0:
    raise ValueError(f"ModelConfig.num_experts={cfg.num_experts} must be >= 0 (0: dense)")
  if cfg.decoder_sparse_step < 1:
    raise ValueError(f"ModelConfig.decoder_sparse_step={cfg.decoder_sparse_step} must be >= 1")
  if cfg.shared_expert_intermediate_size < 0:
    raise ValueError("ModelConfig.shared_expert_intermediate_size="
                     f"{cfg.shared_expert_intermediate_size} must be >= 0 (0: none)")
  if cfg.num_experts == 0:
    return
  if not 1 <= cfg.num_experts_per_tok <= cfg.num_experts:
    raise ValueError(f"ModelConfig.num_experts_per_tok={cfg.num_experts_per_tok} must be in "
                     f"[1, num_experts={cfg.num_experts}]")
  if cfg.moe_intermediate_size < 1:
    raise ValueError(f"ModelConfig.moe_intermediate_size={cfg.moe_intermediate_size} must be "
                     ">= 1 when num_experts > 0")


def _rope_scaling_from_dict(d: Mapping[str, Any]) -> RopeScaling:
  kind = d.get("rope_type", d.get("type", "llama3"))
  if kind != "llama3":
    raise ValueError(f"rope_scaling type {kind!r} is not supported; supported: 'llama3'")
  fields = {f.name for f in dataclasses.fields(RopeScaling)}
  return RopeScaling(**{k: v for k, v in d.items() if k in fields})
