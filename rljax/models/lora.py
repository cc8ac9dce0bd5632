"""LoRA adapters on the decoder's projections: add, switch off, merge, PEFT in and out.

Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models", arXiv:2106.09685:
a frozen weight W gets a trainable update ΔW = (α/r)·A·B, A [in, r] random and B [r, out]
zero at initialisation, so the adapted model starts equal to the base. For RL, "LoRA
Without Regret" (Schulman & Thinking Machines 2025) finds that adapters on every
projection, MLP included, match full fine-tuning even at rank 1, at ~10x its learning rate.

Each adapter is an `nnx.Module` attribute `<name>_lora` beside the projection `<name>`
(`attn.q_lora`, `mlp.down_lora`, ...) holding `nnx.LoRAParam`s `a` [*in_shape, r] and
`b` [r, *out_shape] in float32 with logical axes (the base's own plus "lora"), so
`rljax.parallel` shards them like their weight. In a scanned decoder
(`ModelConfig.scan_layers`) the adapters of a `LayerStack`'s n layers are stacked like its
weights: `a` [n, *in_shape, r], `b` [n, r, *out_shape], "layers" first. `rljax.models.layers` applies them in
every entry point: the full forward, `hidden_states`, `forward_cached`, and the fused
decode weights (merged there once per call, i.e. once per rollout).

Select trainable and frozen parameters with `nnx.LoRAParam` and `nnx.Not(nnx.LoRAParam)`
(never a bare `nnx.Param` filter: LoRAParam is a subclass of Param). A mixture-of-experts
model takes attention targets only: expert LoRA is not built (PEFT reads gate/up/down on
`transformers`' Qwen3-MoE as its fused experts).
"""

from __future__ import annotations

import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rljax.models.config import ModelConfig
from rljax.models.decoder import Decoder
from rljax.models.layers import merged_weight
from rljax.models.stack import LayerStack, stack_modules

TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
_ATTENTION = ("q", "k", "v", "o")
_HF_MODULE = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj",
              "o": "self_attn.o_proj", "gate": "mlp.gate_proj", "up": "mlp.up_proj",
              "down": "mlp.down_proj"}


class LoRAAdapter(nnx.Module):
  """ΔW = (α/r)·A·B for one projection W of shape [*in_shape, *out_shape].

  A is initialised uniform in ±1/sqrt(prod(in_shape)) (PEFT's kaiming-uniform with
  a = √5) and B at zero (Hu et al. 2021, Sec. 4.1), so ΔW = 0 at the start.

  Attributes:
    a: LoRAParam [*in_shape, r], float32.
    b: LoRAParam [r, *out_shape], float32.
    scale: α / r (static).
  """

  def __init__(self, in_shape, out_shape, *, rank: int, alpha: float, in_axes, out_axes,
               rngs: nnx.Rngs):
    fan_in = math.prod(in_shape)
    bound = 1.0 / math.sqrt(fan_in)
    a = jax.random.uniform(rngs.params(), (*in_shape, rank), jnp.float32, -bound, bound)
    self.a = nnx.LoRAParam(a, out_sharding=(*in_axes, "lora"), eager_sharding=False)
    self.b = nnx.LoRAParam(jnp.zeros((rank, *out_shape), jnp.float32),
                           out_sharding=("lora", *out_axes), eager_sharding=False)
    self.rank, self.alpha = int(rank), float(alpha)
    self.scale = float(alpha) / int(rank)


def _shapes(name, cfg: ModelConfig):
  """(in_shape, out_shape) of projection `name` in rljax's layout."""
  d, f, h, k, dh = (cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads,
                    cfg.head_dim)
  return {"q": ((d,), (h, dh)), "k": ((d,), (k, dh)), "v": ((d,), (k, dh)),
          "o": ((h, dh), (d,)), "gate": ((d,), (f,)), "up": ((d,), (f,)),
          "down": ((f,), (d,))}[name]


def _owner(layer, name):
  return layer.attn if name in _ATTENTION else layer.mlp


def _groups(model):
  """(index of its first layer, the module holding its parameters, n layers stacked or None
  for a single layer) of each block of the decoder."""
  out, first = [], 0
  for block in getattr(model, "layers", []):
    count = block.count if isinstance(block, LayerStack) else None
    out.append((first, block if count is None else block.layer, count))
    first += count or 1
  return out


def _check_targets(targets):
  targets = tuple(targets)
  unknown = [t for t in targets if t not in TARGETS]
  if unknown or not targets or len(set(targets)) != len(targets):
    raise ValueError(f"LoRA targets {targets!r}: each must be one of {list(TARGETS)}, "
                     "at least one, no repeats")
  return targets


def add_lora(model, *, rank: int, alpha: float, targets=TARGETS, rngs: nnx.Rngs):
  """Adds fp32 LoRA adapters (B = 0) to the chosen projections of every layer, in place.

  Works on any decoder `load_hf` returns and on `Decoder`s built from a config; the base
  weights are untouched (bf16 bases keep fp32 adapters).

  Args:
    model: a `rljax.models.Decoder`.
    rank: r ≥ 1.
    alpha: α > 0; the update is scaled by α / r.
    targets: projection names among q, k, v, o, gate, up, down.
    rngs: for A's initialisation.
  Returns:
    the model (with `len(targets) × num_layers` adapters).
  Raises:
    ValueError: bad rank/alpha/targets (gate/up/down on a mixture-of-experts model), or a
      model that already has adapters.
  """
  targets = _check_targets(targets)
  if int(rank) < 1 or float(alpha) <= 0:
    raise ValueError(f"LoRA needs rank >= 1 and alpha > 0, got rank={rank}, alpha={alpha}")
  if has_lora(model):
    raise ValueError("add_lora: the model already has LoRA adapters")
  mlp = [t for t in targets if t not in _ATTENTION]
  if mlp and getattr(model.cfg, "num_experts", 0):
    raise ValueError(f"LoRA targets {mlp} on a mixture-of-experts model: expert LoRA is not "
                     "built (PEFT adapts the fused experts there); target q, k, v, o only "
                     "(config: model.lora_targets)")
  for _, layer, count in _groups(model):
    # layer by layer, target by target: a stack's A are the same layers' unstacked A
    made = [[_new_adapter(layer, name, model.cfg, rank, alpha, count, rngs)
             for name in targets] for _ in range(count or 1)]
    for k, name in enumerate(targets):
      new = [row[k] for row in made]
      setattr(_owner(layer, name), f"{name}_lora",
              new[0] if count is None else stack_modules(new))
  return model


def _new_adapter(layer, name, cfg, rank, alpha, count, rngs):
  axes = getattr(_owner(layer, name), name).get_metadata()["out_sharding"]
  axes = axes if count is None else axes[1:]   # a stack's weights: "layers" first
  in_shape, out_shape = _shapes(name, cfg)
  return LoRAAdapter(in_shape, out_shape, rank=rank, alpha=alpha, in_axes=axes[:len(in_shape)],
                     out_axes=axes[len(in_shape):], rngs=rngs)


def _slots(model):
  """(first layer index, layers stacked or None, module holding them, projection name,
  adapter) of every adapter."""
  out = []
  for first, layer, count in _groups(model):
    for name in TARGETS:
      adapter = getattr(_owner(layer, name), f"{name}_lora", None)
      if adapter is not None:
        out.append((first, count, layer, name, adapter))
  return out


def adapters(model):
  """{(layer index, projection name): LoRAAdapter} of the model (empty without LoRA).

  In a scanned decoder the key's index is the first layer of the adapter's `LayerStack`,
  and the adapter holds the stack's layers on its leading axis.
  """
  return {(first, name): adapter for first, _, _, name, adapter in _slots(model)}


def has_lora(model) -> bool:  # noqa: D103
  return bool(adapters(model))


def lora_config(model) -> dict:
  """{"rank", "alpha", "targets"} of a LoRA model (one rank and alpha for all adapters)."""
  found = adapters(model)
  if not found:
    raise ValueError("the model has no LoRA adapters (rljax.models.add_lora)")
  first = next(iter(found.values()))
  targets = tuple(t for t in TARGETS if any(name == t for _, name in found))
  return {"rank": first.rank, "alpha": first.alpha, "targets": targets}


def adapters_off(lora_state):
  """The LoRA state with every adapter zeroed: the model it merges into is the base model.

  The reference policy of a LoRA run (verl / TRL `disable_adapter()`): the same base
  parameters, so no second copy of the base exists; only the adapters are copied.
  """
  return jax.tree.map(jnp.zeros_like, lora_state)


def merge_lora(model):
  """A plain decoder (no adapters) whose weights are W + (α/r)·A·B; the input is unchanged."""
  merged = Decoder(model.cfg, rngs=nnx.Rngs(0))
  base = nnx.state(model, nnx.Not(nnx.LoRAParam))
  nnx.update(merged, base)
  merged_layers = {first: layer for first, layer, _ in _groups(merged)}
  for first, _, layer, name, _ in _slots(model):
    w = getattr(_owner(merged_layers[first], name), name)
    w[...] = merged_weight(_owner(layer, name), name).astype(w[...].dtype)
  return merged


# ---------------------------------------------------------------- PEFT interchange
def _peft_layout(name, cfg: ModelConfig):
  """(A -> lora_A [r, in], B -> lora_B [out, r]) and back, for projection `name`."""
  in_shape, out_shape = _shapes(name, cfg)
  n_in, n_out = math.prod(in_shape), math.prod(out_shape)
  a_to = lambda a: a.reshape(n_in, -1).T                      # [*in, r] -> [r, in]  # noqa: E731
  b_to = lambda b: b.reshape(-1, n_out).T                     # [r, *out] -> [out, r]  # noqa: E731
  a_from = lambda x: x.T.reshape(*in_shape, -1)               # noqa: E731
  b_from = lambda x: x.T.reshape(-1, *out_shape)              # noqa: E731
  return a_to, b_to, a_from, b_from


def _peft_key(i, name, which):
  return f"base_model.model.model.layers.{i}.{_HF_MODULE[name]}.lora_{which}.weight"


def save_peft_adapter(model, model_config: ModelConfig, path: str, *,
                      base_model_name_or_path: str = "") -> None:
  """Writes `adapter_config.json` + `adapter_model.safetensors` loadable by
  `peft.PeftModel.from_pretrained(hf_base, path)`.

  HF layouts: lora_A [r, in], lora_B [out, r], with out/in flattened as in the HF weight
  ([H·Dh] for q/k/v, [H·Dh] inputs of o_proj); `lora_alpha` is the real α (PEFT scales
  by α/r, as rljax does).
  """
  from safetensors.numpy import save_file

  cfg = lora_config(model)
  tensors = {}
  for first, count, _, name, adapter in _slots(model):
    a_to, b_to, _, _ = _peft_layout(name, model_config)
    a, b = np.asarray(adapter.a[...], np.float32), np.asarray(adapter.b[...], np.float32)
    for j in range(count or 1):   # a stack's layers one by one
      a_j, b_j = (a, b) if count is None else (a[j], b[j])
      tensors[_peft_key(first + j, name, "A")] = np.ascontiguousarray(a_to(a_j))
      tensors[_peft_key(first + j, name, "B")] = np.ascontiguousarray(b_to(b_j))
  peft_cfg = {
      "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": cfg["rank"],
      "lora_alpha": cfg["alpha"], "lora_dropout": 0.0, "bias": "none",
      "target_modules": sorted(_HF_MODULE[t].split(".")[-1] for t in cfg["targets"]),
      "fan_in_fan_out": False, "use_rslora": False, "use_dora": False,
      "init_lora_weights": True, "inference_mode": True,
      "base_model_name_or_path": base_model_name_or_path or None,
  }
  os.makedirs(path, exist_ok=True)
  with open(os.path.join(path, "adapter_config.json"), "w") as f:
    json.dump(peft_cfg, f, indent=2)
  save_file(tensors, os.path.join(path, "adapter_model.safetensors"),
            metadata={"format": "pt"})


def load_peft_adapter(model, path: str, *, rngs: nnx.Rngs | None = None):
  """Reads a PEFT LoRA adapter into `model` (adding adapters of its rank, α and targets
  when the model has none); returns the model.

  Raises:
    ValueError: an adapter type, option or target rljax does not support, or a rank /
      target set that differs from the adapters the model already has.
  """
  from safetensors.numpy import load_file

  with open(os.path.join(path, "adapter_config.json")) as f:
    peft_cfg = json.load(f)
  if peft_cfg.get("peft_type", "LORA") != "LORA" or peft_cfg.get("use_dora") or \
      peft_cfg.get("use_rslora") or peft_cfg.get("fan_in_fan_out"):
    raise ValueError(f"{path}: only plain LoRA adapters are supported (no DoRA, rsLoRA, "
                     "fan_in_fan_out)")
  by_hf = {v.split(".")[-1]: k for k, v in _HF_MODULE.items()}
  modules = peft_cfg["target_modules"]
  if isinstance(modules, str):
    raise ValueError(f"{path}: target_modules={modules!r} (a regex / 'all-linear') is not "
                     "supported; list the modules")
  unknown = [m for m in modules if m not in by_hf]
  if unknown:
    raise ValueError(f"{path}: target modules {unknown} have no rljax projection "
                     f"(supported: {sorted(by_hf)})")
  targets = tuple(t for t in TARGETS if t in {by_hf[m] for m in modules})
  rank, alpha = int(peft_cfg["r"]), float(peft_cfg["lora_alpha"])
  if not has_lora(model):
    add_lora(model, rank=rank, alpha=alpha, targets=targets, rngs=rngs or nnx.Rngs(0))
  have = lora_config(model)
  if have["rank"] != rank or set(have["targets"]) != set(targets):
    raise ValueError(f"{path}: adapter rank {rank} / targets {targets} differ from the "
                     f"model's ({have['rank']}, {have['targets']})")
  tensors = load_file(os.path.join(path, "adapter_model.safetensors"))
  for first, count, _, name, adapter in _slots(model):
    _, _, a_from, b_from = _peft_layout(name, model.cfg)
    layers = range(first, first + (count or 1))
    a = [a_from(tensors[_peft_key(i, name, "A")]) for i in layers]
    b = [b_from(tensors[_peft_key(i, name, "B")]) for i in layers]
    adapter.a[...] = jnp.asarray(a[0] if count is None else np.stack(a), jnp.float32)
    adapter.b[...] = jnp.asarray(b[0] if count is None else np.stack(b), jnp.float32)
    adapter.alpha, adapter.scale = alpha, alpha / rank
  return model
