"""Hugging Face checkpoints in and out (Llama, Qwen2, Qwen3, Qwen2-MoE, Qwen3-MoE), without
PyTorch at run time.

`load_hf` reads `config.json` and `*.safetensors` (one file, or shards listed in
`model.safetensors.index.json`) from a local directory; `save_hf` writes the same layout,
loadable by `transformers.AutoModelForCausalLM.from_pretrained`. config.json itself is
translated by `rljax.models.hf_config`; a MoE layer's tensors by `rljax.models.moe_hf`.
"""

from __future__ import annotations

import functools
import glob
import json
import logging
import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors.numpy import save_file

from rljax.host_memory import release_freed_host_memory
from rljax.models import lora
from rljax.models.config import ModelConfig
from rljax.models.decoder import Decoder
from rljax.models.heads import RewardModel
from rljax.models.hf_config import (  # noqa: F401  (config_from_hf: re-exported)
  config_from_hf,
  config_to_hf,
  export_config,
  hf_class,
  read_config,
)
from rljax.models.hf_specs import TensorSpec, index_depth, tensor_specs, whole

_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


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
    out.update({k: file for k in safetensors_header(file)[0]})
  return out


# safetensors dtype names -> NumPy dtypes (bfloat16: ml_dtypes, which jax depends on)
_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": jnp.bfloat16,
           "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
           "BOOL": np.bool_}


def safetensors_header(file: str) -> tuple[dict, int]:
  """(the JSON header of a safetensors `file`: name -> {dtype, shape, data_offsets}, the
  byte offset where the tensor data starts). Format: a little-endian u64 header length,
  the header, then the tensors' bytes."""
  with open(file, "rb") as f:
    n = int.from_bytes(f.read(8), "little")
    header = json.loads(f.read(n))
  header.pop("__metadata__", None)
  return header, 8 + n


def read_tensor(file: str, name: str, header=None) -> np.ndarray:
  """Tensor `name` of the safetensors `file`, read into a NumPy array of its own.

  Read with ordinary file reads, not through a memory map (safetensors' `safe_open`): the
  mapped pages a read touches count in the process's resident set while the map is open,
  which held over a whole checkpoint added its size on top of the parameters (Qwen2.5-0.5B
  in float32: peak RSS 4.7 GB for 1.9 GB of parameters; the page cache does not count).

  Args:
    header: `safetensors_header(file)`, when the caller reads several tensors.
  """
  entries, base = header or safetensors_header(file)
  entry = entries[name]
  begin, end = entry["data_offsets"]
  out = np.empty(entry["shape"], _DTYPES[entry["dtype"]])
  if out.nbytes != end - begin:
    raise ValueError(f"{file}: tensor {name!r} holds {end - begin} bytes, its dtype and shape "
                     f"{out.nbytes}")
  with open(file, "rb") as f:
    f.seek(base + begin)
    if f.readinto(memoryview(out.reshape(-1).view(np.uint8))) != out.nbytes:
      raise ValueError(f"{file}: tensor {name!r} is truncated")
  return out


@functools.partial(jax.jit, donate_argnums=0)
def _write_slot(buf, value, starts):
  """`buf` with `value` written at the leading indices `starts` (int32 [k]), in place."""
  k = starts.shape[0]
  update = value.reshape((1,) * k + value.shape).astype(buf.dtype)
  return jax.lax.dynamic_update_slice(buf, update, (*starts, *([0] * value.ndim)))


def _set(pending: dict, var, index, value) -> None:
  """Writes `value` into `var`, or into slot `index` (an int or a tuple over its leading
  axes) of its buffer in `pending`; a Variable read in slices is set once all are in.

  A stacked Variable's buffer is XLA's from the start, each slice written into it in
  place: the host holds one slice at a time, never a second copy of the stack (nor do
  the parameters end up in host buffers XLA did not allocate, which a donating update
  step could not reuse in place).
  """
  if index is None:
    var.set_value(jnp.array(value))
    return
  depth = index_depth(index)
  if id(var) not in pending:
    pending[id(var)] = [jnp.zeros(var.shape, value.dtype), set()]
  entry = pending[id(var)]
  starts = np.atleast_1d(np.asarray(index, np.int32))
  entry[0] = _write_slot(entry[0], value, starts)
  entry[1].add(index)
  if len(entry[1]) == int(np.prod(var.shape[:depth])):
    var.set_value(pending.pop(id(var))[0])


# Freed read buffers of this size and up go back to the OS as they are freed: glibc keeps
# blocks below its (self-raising) mmap threshold in its heap, which held ~45 MB of them at
# the end of loading Qwen2.5-0.5B, on top of all the parameters: the sampler's peak.
TRIM_AFTER_BYTES = 8 * 2 ** 20


def _fill(model, specs, path, cfg) -> None:
  """Reads every tensor in `specs` from the checkpoint at `path` into `model`."""
  where = _tensor_index(path)
  pending, used, headers = {}, set(), {}
  located = [(spec, *spec.get(model)) for spec in specs]
  # whole tensors first, largest first: each is read, then copied into XLA's buffer, so
  # its transient second copy comes while little else is resident
  located.sort(key=lambda x: (x[2] is not None, -int(np.prod(x[1].shape)) * (x[2] is None)))
  for spec, var, index in located:
    if spec.hf_name not in where:
      raise ValueError(f"Tensor {spec.hf_name!r} missing from checkpoint {path!r} "
                       f"({hf_class(cfg)})")
    want = tuple(var.shape)[index_depth(index):]
    file = where[spec.hf_name]
    if file not in headers:
      headers[file] = safetensors_header(file)
    value = spec.from_hf(read_tensor(file, spec.hf_name, headers[file]))
    if tuple(value.shape) != want:
      raise ValueError(f"Tensor {spec.hf_name!r} has shape {value.shape} after layout "
                       f"conversion, expected {want}")
    _set(pending, var, index, value.astype(cfg.weight_dtype, copy=False))
    used.add(spec.hf_name)
    if value.nbytes >= TRIM_AFTER_BYTES:
      del value   # its read and layout buffers, freed into glibc's heap: handed back now
      release_freed_host_memory()
  extra = [k for k in where if k not in used and not k.endswith(_IGNORED_SUFFIXES)]
  if extra and not (cfg.tie_embeddings and extra == ["lm_head.weight"]):
    logging.warning("load_hf(%s): %d unused tensors, e.g. %s", path, len(extra), extra[:5])


def abstract_hf(path: str, *, dtype=None, param_dtype=None, attention: str = "auto",
                scan_layers: bool = True) -> tuple[Decoder, ModelConfig]:
  """The model `load_hf` with the same arguments returns, abstract (`nnx.eval_shape`: shapes
  and dtypes, no parameter allocated; config.json only is read): for compiling its
  programs before the weights are resident (`rljax.sampling.precompile`).

  Returns:
    (abstract model, model_config).
  """
  cfg = read_config(path, dtype=dtype, param_dtype=param_dtype).replace(
      attention=attention, scan_layers=scan_layers)
  return nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0))), cfg


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
  model, cfg = abstract_hf(path, dtype=dtype, param_dtype=param_dtype, attention=attention,
                           scan_layers=scan_layers)
  _fill(model, tensor_specs(cfg), path, cfg)
  release_freed_host_memory()   # the read buffers, freed: -55 MB resident at Qwen2.5-0.5B's
  return model, cfg


def _reward_specs(cfg: ModelConfig) -> list[TensorSpec]:
  trunk = [s._replace(get=lambda m, g=s.get: g(m.trunk))
           for s in tensor_specs(cfg.replace(tie_embeddings=True))]
  score = TensorSpec("score.weight", whole(lambda m: m.head.w), lambda w: w.reshape(-1),
                     lambda w: w.reshape(1, -1))
  return trunk + [score]


def load_hf_reward(path: str, *, dtype=None, param_dtype=None):
  """Loads a Llama / Qwen2 / Qwen3 *ForSequenceClassification (num_labels 1) reward model.

  Returns:
    (`RewardModel`, model_config); the score head bias is 0 (HF's `score` has none).
  """

  cfg = read_config(path, dtype=dtype, param_dtype=param_dtype, reward=True)
  model = nnx.eval_shape(lambda: RewardModel(cfg, rngs=nnx.Rngs(0)))
  _fill(model, _reward_specs(cfg), path, cfg.replace(tie_embeddings=True))
  model.head.b.set_value(jnp.zeros((), cfg.weight_dtype))
  return model, cfg


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
      value = np.zeros(var.shape[index_depth(index):], cfg.weight_dtype)
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
  export_cfg = export_config(model_config)
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
  export_cfg = export_config(model_config)
  shapes = nnx.eval_shape(lambda: RewardModel(export_cfg, rngs=nnx.Rngs(0)))
  hf_cfg = config_to_hf(model_config)
  hf_cfg.update(architectures=[hf_class(model_config).replace(
      "CausalLM", "SequenceClassification")], num_labels=1, tie_word_embeddings=False)
  if hf_cfg.get("pad_token_id") is None:
    hf_cfg["pad_token_id"] = hf_cfg.get("eos_token_id") if isinstance(
        hf_cfg.get("eos_token_id"), int) else 0
  _write(model, _reward_specs(export_cfg), shapes, model_config, hf_cfg, path)
