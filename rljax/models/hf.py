"""Hugging Face checkpoints in and out (Llama, Qwen2, Qwen3), without PyTorch at run time.

`load_hf` reads `config.json` and `*.safetensors` (one file, or shards listed in
`model.safetensors.index.json`) from a local directory; `save_hf` writes the same layout,
loadable by `transformers.AutoModelForCausalLM.from_pretrained`.
"""

from __future__ import annotations

import glob
import json
import logging
import os
from collections.abc import Callable
from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors import safe_open
from safetensors.numpy import save_file

from rljax.models import lora
from rljax.models.config import ModelConfig, RopeScaling
from rljax.models.decoder import Decoder
from rljax.models.heads import RewardModel

_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}
_HF_CLASS = {v: k for k, v in _ARCHITECTURES.items()}
_REWARD_ARCHITECTURES = {k.replace("CausalLM", "SequenceClassification"): v
                         for k, v in _ARCHITECTURES.items()}
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class TensorSpec(NamedTuple):
  """One HF tensor <-> one rljax parameter, or one layer's slice of a stacked parameter
  (`ModelConfig.scan_layers`: HF's per-layer tensors are stacked on load, split on save)."""

  hf_name: str
  # model -> (the rljax Variable, the layer's index on its leading "layers" axis, or None
  # when the tensor is the whole Variable)
  get: Callable[[Decoder], tuple[nnx.Variable, int | None]]
  from_hf: Callable[[np.ndarray], np.ndarray]  # HF layout -> rljax layout
  to_hf: Callable[[np.ndarray], np.ndarray]  # rljax layout -> HF layout


def _identity(x):
  return x


def _in_split(d, *out):
  """HF [prod(out), D] <-> rljax [D, *out] (q/k/v projections)."""
  return (lambda w: w.T.reshape(d, *out), lambda w: w.reshape(d, -1).T)


def _out_split(d, *inp):
  """HF [D, prod(inp)] <-> rljax [*inp, D] (o projection)."""
  return (lambda w: w.T.reshape(*inp, d), lambda w: w.reshape(-1, d).T)


def _transpose():
  return (lambda w: w.T, lambda w: w.T)


def _reshape(*shape):
  return (lambda w: w.reshape(shape), lambda w: w.reshape(-1))


def _whole(get):
  return lambda m: (get(m), None)


def _in_layer(i, get):
  """Spec getter of layer i's tensor `get(layer module)`, wherever the decoder keeps it."""
  def locate(m):
    module, index = m.locate_layer(i)
    return get(module), index
  return locate


def _layer_tensors(cfg: ModelConfig) -> list[tuple]:
  """(HF name after `model.layers.<i>.`, getter on a layer, from_hf, to_hf) of every
  per-layer tensor."""
  d, h, k, dh = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  out = [
      ("input_layernorm.weight", lambda L: L.attn_norm.scale, _identity, _identity),
      ("post_attention_layernorm.weight", lambda L: L.mlp_norm.scale, _identity, _identity),
      ("self_attn.q_proj.weight", lambda L: L.attn.q, *_in_split(d, h, dh)),
      ("self_attn.k_proj.weight", lambda L: L.attn.k, *_in_split(d, k, dh)),
      ("self_attn.v_proj.weight", lambda L: L.attn.v, *_in_split(d, k, dh)),
      ("self_attn.o_proj.weight", lambda L: L.attn.o, *_out_split(d, h, dh)),
      ("mlp.gate_proj.weight", lambda L: L.mlp.gate, *_transpose()),
      ("mlp.up_proj.weight", lambda L: L.mlp.up, *_transpose()),
      ("mlp.down_proj.weight", lambda L: L.mlp.down, *_transpose()),
  ]
  if cfg.attention_bias:
    out += [("self_attn.q_proj.bias", lambda L: L.attn.q_bias, *_reshape(h, dh)),
            ("self_attn.k_proj.bias", lambda L: L.attn.k_bias, *_reshape(k, dh)),
            ("self_attn.v_proj.bias", lambda L: L.attn.v_bias, *_reshape(k, dh))]
  if cfg.attention_out_bias:
    out.append(("self_attn.o_proj.bias", lambda L: L.attn.o_bias, _identity, _identity))
  if cfg.qk_norm:
    out += [("self_attn.q_norm.weight", lambda L: L.attn.q_norm.scale, _identity, _identity),
            ("self_attn.k_norm.weight", lambda L: L.attn.k_norm.scale, _identity, _identity)]
  return out


def tensor_specs(cfg: ModelConfig) -> list[TensorSpec]:
  """The full HF <-> rljax name and layout mapping for `cfg`.

  Per-layer tensors come parameter by parameter (every layer's q_proj, then every layer's
  k_proj, ...), so a stacked parameter is read, or written, whole before the next one.
  """
  specs = [TensorSpec("model.embed_tokens.weight", _whole(lambda m: m.embed), _identity,
                      _identity),
           TensorSpec("model.norm.weight", _whole(lambda m: m.final_norm.scale), _identity,
                      _identity)]
  if not cfg.tie_embeddings:
    specs.append(TensorSpec("lm_head.weight", _whole(lambda m: m.lm_head), *_transpose()))
  for suffix, get, from_hf, to_hf in _layer_tensors(cfg):
    specs += [TensorSpec(f"model.layers.{i}.{suffix}", _in_layer(i, get), from_hf, to_hf)
              for i in range(cfg.num_layers)]
  return specs


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
  table = _REWARD_ARCHITECTURES if reward else _ARCHITECTURES
  archs = hf.get("architectures") or []
  arch_name = archs[0] if archs else hf.get("model_type", "<none>")
  arch = table.get(arch_name) or (
      hf.get("model_type") if not archs and hf.get("model_type") in _HF_CLASS else None)
  if arch is None:
    raise ValueError(f"Unsupported architecture {arch_name!r}; "
                     f"{'load_hf_reward' if reward else 'load_hf'} supports {sorted(table)}")
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
  dtype = jnp.dtype(dtype or "float32").name
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
      dtype=dtype, param_dtype=jnp.dtype(param_dtype or "float32").name,
      bos_token_id=hf.get("bos_token_id"), eos_token_id=hf.get("eos_token_id"),
      pad_token_id=hf.get("pad_token_id"))


def _tensor_index(path: str) -> dict[str, str]:
  """Tensor name -> safetensors file that holds it."""
  index = os.path.join(path, "model.safetensors.index.json")
  if os.path.exists(index):
    with open(index) as f:
      weight_map = json.load(f)["weight_map"]
    return {k: os.path.join(path, v) for k, v in weight_map.items()}
  files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
  if not files:
    raise FileNotFoundError(f"No *.safetensors files in {path!r} (PyTorch .bin is not read)")
  out = {}
  for file in files:
    with safe_open(file, framework="np") as f:
      out.update({k: file for k in f.keys()})
  return out


def _set(pending: dict, var, index, value) -> None:
  """Writes `value` into `var`, or into slot `index` of its host buffer in `pending`; a
  stacked Variable is set once all its layers are in (then its buffer is dropped)."""
  if index is None:
    var.set_value(jnp.asarray(value))
    return
  entry = pending.setdefault(id(var), [np.empty(var.shape, value.dtype), set()])
  entry[0][index] = value
  entry[1].add(index)
  if len(entry[1]) == var.shape[0]:
    var.set_value(jnp.asarray(pending.pop(id(var))[0]))


def _fill(model, specs, path, cfg) -> None:
  """Reads every tensor in `specs` from the checkpoint at `path` into `model`."""
  where = _tensor_index(path)
  handles, pending = {}, {}
  used = set()
  try:
    for spec in specs:
      if spec.hf_name not in where:
        raise ValueError(f"Tensor {spec.hf_name!r} missing from checkpoint {path!r} "
                         f"({_HF_CLASS[cfg.arch]})")
      file = where[spec.hf_name]
      if file not in handles:
        handles[file] = safe_open(file, framework="np").__enter__()
      var, index = spec.get(model)
      want = tuple(var.shape) if index is None else tuple(var.shape[1:])
      value = spec.from_hf(handles[file].get_tensor(spec.hf_name))
      if tuple(value.shape) != want:
        raise ValueError(f"Tensor {spec.hf_name!r} has shape {value.shape} after layout "
                         f"conversion, expected {want}")
      _set(pending, var, index, value.astype(cfg.weight_dtype))
      used.add(spec.hf_name)
  finally:
    for h in handles.values():
      h.__exit__(None, None, None)
  extra = [k for k in where if k not in used and not k.endswith(_IGNORED_SUFFIXES)]
  if extra and not (cfg.tie_embeddings and extra == ["lm_head.weight"]):
    logging.warning("load_hf(%s): %d unused tensors, e.g. %s", path, len(extra), extra[:5])


def _read_config(path, **kwargs) -> ModelConfig:
  with open(os.path.join(path, "config.json")) as f:
    return config_from_hf(json.load(f), **kwargs)


def load_hf(path: str, *, dtype=None, param_dtype=None,
            attention: str = "auto", scan_layers: bool = True) -> tuple[Decoder, ModelConfig]:
  """Loads a local Hugging Face Llama / Qwen2 / Qwen3 causal-LM checkpoint directory.

  Args:
    path: directory with config.json and *.safetensors (one file or sharded with
      model.safetensors.index.json).
    dtype: compute dtype (default float32, whatever the checkpoint's storage dtype).
    param_dtype: parameter storage dtype (default float32: master weights for training
      stay float32 under bf16 compute; pass "bfloat16" to halve memory for inference).
    attention: `ModelConfig.attention` (how attention runs; not in config.json).
    scan_layers: `ModelConfig.scan_layers` (the per-layer tensors stacked into one
      `LayerStack`, or one module per layer; the same values either way).
  Returns:
    (model, model_config).
  Raises:
    ValueError: unsupported architecture or a tensor missing from the checkpoint.
  """
  cfg = _read_config(path, dtype=dtype, param_dtype=param_dtype).replace(
      attention=attention, scan_layers=scan_layers)
  model = nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0)))
  _fill(model, tensor_specs(cfg), path, cfg)
  return model, cfg


def _reward_specs(cfg: ModelConfig) -> list[TensorSpec]:
  trunk = [s._replace(get=lambda m, g=s.get: g(m.trunk))
           for s in tensor_specs(cfg.replace(tie_embeddings=True))]
  score = TensorSpec("score.weight", _whole(lambda m: m.head.w), lambda w: w.reshape(-1),
                     lambda w: w.reshape(1, -1))
  return trunk + [score]


def load_hf_reward(path: str, *, dtype=None, param_dtype=None):
  """Loads a Llama / Qwen2 / Qwen3 *ForSequenceClassification (num_labels 1) reward model.

  Returns:
    (`RewardModel`, model_config); the score head bias is 0 (HF's `score` has none).
  """

  cfg = _read_config(path, dtype=dtype, param_dtype=param_dtype, reward=True)
  model = nnx.eval_shape(lambda: RewardModel(cfg, rngs=nnx.Rngs(0)))
  _fill(model, _reward_specs(cfg), path, cfg.replace(tie_embeddings=True))
  model.head.b.set_value(jnp.zeros((), cfg.weight_dtype))
  return model, cfg


def config_to_hf(cfg: ModelConfig) -> dict[str, Any]:
  """`ModelConfig` -> config.json dict for `transformers` (legacy and v5 RoPE keys)."""
  rope_params: dict[str, Any] = {"rope_type": "default", "rope_theta": cfg.rope_theta}
  rs: RopeScaling | None = cfg.rope_scaling
  if rs is not None:
    rope_params.update(rope_type="llama3", factor=rs.factor,
                       low_freq_factor=rs.low_freq_factor, high_freq_factor=rs.high_freq_factor,
                       original_max_position_embeddings=rs.original_max_position_embeddings)
  out = {
      "architectures": [_HF_CLASS[cfg.arch]], "model_type": cfg.arch,
      "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
      "intermediate_size": cfg.intermediate_size, "num_hidden_layers": cfg.num_layers,
      "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads,
      "head_dim": cfg.head_dim, "hidden_act": "silu", "rms_norm_eps": cfg.rms_norm_eps,
      "rope_theta": cfg.rope_theta, "rope_parameters": rope_params,
      "tie_word_embeddings": cfg.tie_embeddings,
      "max_position_embeddings": cfg.max_position_embeddings,
      "torch_dtype": cfg.param_dtype, "dtype": cfg.param_dtype,
      "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id,
      "pad_token_id": cfg.pad_token_id,
  }
  if rs is not None:
    out["rope_scaling"] = rope_params
  if cfg.arch != "qwen2":
    out["attention_bias"] = cfg.attention_bias or cfg.attention_out_bias
  else:
    out["use_sliding_window"] = False
  return out


def _export_config(cfg: ModelConfig) -> ModelConfig:
  """The config with the HF architecture's bias layout (missing biases are zero-filled)."""
  full_bias = cfg.arch == "qwen2" or cfg.attention_bias or cfg.attention_out_bias
  return cfg.replace(attention_bias=full_bias, attention_out_bias=cfg.arch != "qwen2" and full_bias)


def _to_numpy(x) -> np.ndarray:
  """Host copy of a parameter, gathering it first if it spans several processes."""
  if getattr(x, "is_fully_addressable", True):
    return np.asarray(x)
  from jax.experimental import multihost_utils

  return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def _write(model, specs, shapes_model, cfg, hf_cfg, path) -> None:
  tensors = {}
  host = (None, None)   # (Variable, its host copy): a stacked one is copied once
  for spec in specs:
    try:
      var, index = spec.get(model)
    except AttributeError:  # a bias this model does not have
      var, index = spec.get(shapes_model)
      value = np.zeros(var.shape if index is None else var.shape[1:], cfg.weight_dtype)
    else:
      if host[0] is not var:
        host = (var, _to_numpy(var[...]))
      value = host[1] if index is None else host[1][index]
    tensors[spec.hf_name] = np.ascontiguousarray(spec.to_hf(value))
  os.makedirs(path, exist_ok=True)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(hf_cfg, f, indent=2)
  save_file(tensors, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})


def save_hf(model: Decoder, model_config: ModelConfig, path: str) -> None:
  """Writes config.json + model.safetensors loadable by `transformers.from_pretrained`.

  Note: biases the HF architecture always has (Qwen2 q/k/v; Llama/Qwen3 q/k/v/o when
  attention_bias) but the rljax model lacks are written as zeros, which is exact. A model
  with LoRA adapters is written merged.
  """
  if lora.has_lora(model):   # LoRA: the merged weights W + (α/r)·A·B
    model = lora.merge_lora(model)
  export_cfg = _export_config(model_config)
  shapes = nnx.eval_shape(lambda: Decoder(export_cfg, rngs=nnx.Rngs(0)))
  _write(model, tensor_specs(export_cfg), shapes, model_config, config_to_hf(model_config),
         path)


def save_hf_reward(model, model_config: ModelConfig, path: str) -> None:
  """Writes a `RewardModel` as *ForSequenceClassification (num_labels 1).

  Note: HF's score layer has no bias; a non-zero head bias (a constant shift of every
  reward, which Bradley-Terry training cannot identify) is dropped with a warning.
  """
  bias = float(np.asarray(model.head.b[...], np.float32))
  if bias != 0.0:
    logging.warning("save_hf_reward: dropping score bias %g (HF score has no bias)", bias)
  export_cfg = _export_config(model_config)
  shapes = nnx.eval_shape(lambda: RewardModel(export_cfg, rngs=nnx.Rngs(0)))
  hf_cfg = config_to_hf(model_config)
  hf_cfg.update(architectures=[_HF_CLASS[model_config.arch].replace(
      "CausalLM", "SequenceClassification")], num_labels=1, tie_word_embeddings=False)
  if hf_cfg.get("pad_token_id") is None:
    hf_cfg["pad_token_id"] = hf_cfg.get("eos_token_id") if isinstance(
        hf_cfg.get("eos_token_id"), int) else 0
  _write(model, _reward_specs(export_cfg), shapes, model_config, hf_cfg, path)
