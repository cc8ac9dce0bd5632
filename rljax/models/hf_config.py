"""Hugging Face `config.json` <-> `ModelConfig`: Llama, Qwen2, Qwen3, and their
mixture-of-experts variants Qwen2-MoE and Qwen3-MoE (`rljax.models.moe_hf`).

`rljax.models.hf` (weights in and out) re-exports the public names.
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax.numpy as jnp

from rljax.models.config import ModelConfig, RopeScaling
from rljax.models.moe_hf import moe_config_from_hf, moe_config_to_hf

# HF class -> (ModelConfig.arch, mixture of experts)
ARCHITECTURES = {
    "LlamaForCausalLM": ("llama", False),
    "Qwen2ForCausalLM": ("qwen2", False),
    "Qwen3ForCausalLM": ("qwen3", False),
    "Qwen2MoeForCausalLM": ("qwen2", True),
    "Qwen3MoeForCausalLM": ("qwen3", True),
}
HF_CLASS = {v: k for k, v in ARCHITECTURES.items()}
MODEL_TYPES = {"llama": ("llama", False), "qwen2": ("qwen2", False), "qwen3": ("qwen3", False),
               "qwen2_moe": ("qwen2", True), "qwen3_moe": ("qwen3", True)}
_MODEL_TYPE = {v: k for k, v in MODEL_TYPES.items()}
REWARD_ARCHITECTURES = {k.replace("CausalLM", "SequenceClassification"): v
                        for k, v in ARCHITECTURES.items() if not v[1]}


def hf_class(cfg: ModelConfig) -> str:
  """The `transformers` causal-LM class of `cfg` (e.g. "Qwen3MoeForCausalLM")."""
  return HF_CLASS[(cfg.arch, cfg.num_experts > 0)]


def _architecture(hf: dict[str, Any], reward: bool):
  """(arch, moe) of a config.json, from its `architectures` or else its `model_type`."""
  table = REWARD_ARCHITECTURES if reward else ARCHITECTURES
  archs = hf.get("architectures") or []
  arch_name = archs[0] if archs else hf.get("model_type", "<none>")
  found = table.get(arch_name) or (
      MODEL_TYPES.get(hf.get("model_type")) if not archs and not reward else None)
  if found is None:
    raise ValueError(f"Unsupported architecture {arch_name!r}; "
                     f"{'load_hf_reward' if reward else 'load_hf'} supports {sorted(table)}")
  return arch_name, found


def config_from_hf(hf: dict[str, Any], *, dtype=None, param_dtype=None,
                   reward: bool = False) -> ModelConfig:
  """Translates a `transformers` config.json dict into a `ModelConfig`.

  Args:
    hf: the config.json dict.
    dtype, param_dtype: as for `load_hf`.
    reward: expect a *ForSequenceClassification (reward model) architecture.
  Raises:
    ValueError: unsupported architecture or feature (names it and lists what is supported).
  """
  arch_name, (arch, moe) = _architecture(hf, reward)
  if reward and hf.get("num_labels", len(hf.get("id2label") or [0])) != 1:
    raise ValueError(f"{arch_name}: a reward model needs num_labels == 1")
  if hf.get("hidden_act", "silu") != "silu":
    raise ValueError(f"{arch_name}: hidden_act={hf['hidden_act']!r} unsupported (only 'silu')")
  if hf.get("mlp_bias") or hf.get("use_sliding_window"):
    raise ValueError(f"{arch_name}: mlp_bias / use_sliding_window are not supported")
  rope = dict(hf.get("rope_parameters") or {})
  legacy = hf.get("rope_scaling") or {}
  theta = rope.get("rope_theta", hf.get("rope_theta", 10000.0))
  scaling = {**legacy, **rope}
  kind = scaling.get("rope_type", scaling.get("type", "default"))
  if kind not in ("default", "llama3"):
    raise ValueError(f"{arch_name}: rope type {kind!r} unsupported (supported: default, llama3)")
  heads = hf["num_attention_heads"]
  bias = arch == "qwen2" or bool(hf.get("attention_bias", False))
  experts = moe_config_from_hf(hf) if moe else {}
  return ModelConfig(
      vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
      intermediate_size=hf["intermediate_size"], num_layers=hf["num_hidden_layers"],
      num_heads=heads, num_kv_heads=hf.get("num_key_value_heads") or heads,
      head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
      rms_norm_eps=hf.get("rms_norm_eps", 1e-6), rope_theta=float(theta),
      rope_scaling=scaling if kind == "llama3" else None,
      attention_bias=bias, attention_out_bias=arch != "qwen2" and bias,
      qk_norm=arch == "qwen3", tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
      max_position_embeddings=hf.get("max_position_embeddings", 4096), arch=arch,
      dtype=jnp.dtype(dtype or "float32").name,
      param_dtype=jnp.dtype(param_dtype or "float32").name,
      bos_token_id=hf.get("bos_token_id"), eos_token_id=hf.get("eos_token_id"),
      pad_token_id=hf.get("pad_token_id"), **experts)


def read_config(path, **kwargs) -> ModelConfig:
  """`config_from_hf` of the config.json in directory `path`."""
  with open(os.path.join(path, "config.json")) as f:
    return config_from_hf(json.load(f), **kwargs)


def config_to_hf(cfg: ModelConfig) -> dict[str, Any]:
  """`ModelConfig` -> config.json dict for `transformers` (legacy and v5 RoPE keys)."""
  rope_params: dict[str, Any] = {"rope_type": "default", "rope_theta": cfg.rope_theta}
  rs: RopeScaling | None = cfg.rope_scaling
  if rs is not None:
    rope_params.update(rope_type="llama3", factor=rs.factor,
                       low_freq_factor=rs.low_freq_factor, high_freq_factor=rs.high_freq_factor,
                       original_max_position_embeddings=rs.original_max_position_embeddings)
  moe = cfg.num_experts > 0
  out = {
      "architectures": [hf_class(cfg)], "model_type": _MODEL_TYPE[(cfg.arch, moe)],
      "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
      "intermediate_size": cfg.intermediate_size, "num_hidden_layers": cfg.num_layers,
      "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads,
      "head_dim": cfg.head_dim, "hidden_act": "silu", "rms_norm_eps": cfg.rms_norm_eps,
      "rope_theta": cfg.rope_theta, "rope_parameters": rope_params,
      "tie_word_embeddings": cfg.tie_embeddings,
      "max_position_embeddings": cfg.max_position_embeddings,
      "torch_dtype": cfg.param_dtype, "dtype": cfg.param_dtype,
      "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id,
      "pad_token_id": cfg.pad_token_id, **moe_config_to_hf(cfg),
  }
  if moe and cfg.arch == "qwen2":   # Qwen2-MoE always has a shared expert (0: zero width)
    out["shared_expert_intermediate_size"] = cfg.shared_expert_intermediate_size
  if rs is not None:
    out["rope_scaling"] = rope_params
  if cfg.arch != "qwen2":
    out["attention_bias"] = cfg.attention_bias or cfg.attention_out_bias
  else:
    out["use_sliding_window"] = False
  return out


def export_config(cfg: ModelConfig) -> ModelConfig:
  """The config with the HF architecture's bias layout (missing biases are zero-filled)."""
  full_bias = cfg.arch == "qwen2" or cfg.attention_bias or cfg.attention_out_bias
  return cfg.replace(attention_bias=full_bias, attention_out_bias=cfg.arch != "qwen2" and full_bias)
