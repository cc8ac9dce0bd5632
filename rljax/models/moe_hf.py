"""Qwen3-MoE / Qwen2-MoE checkpoints <-> `MoEMLP` parameters: tensor names, layouts, config.

A saved `Qwen3MoeForCausalLM` (and `Qwen2MoeForCausalLM`) stores every expert's projections
as separate tensors, `model.layers.{i}.mlp.experts.{e}.{gate,up,down}_proj.weight` ([F,D],
[F,D], [D,F], PyTorch `Linear` layout), and the router as `model.layers.{i}.mlp.gate.weight`
[E,D]; Qwen2-MoE adds `mlp.shared_expert.{gate,up,down}_proj.weight` and
`mlp.shared_expert_gate.weight` [1,D]. (`transformers` 5 fuses the experts into
`experts.gate_up_proj` [E,2F,D] in memory but writes the per-expert names.) `MoEMLP` holds
them stacked: `gate`, `up` [E,D,F], `down` [E,F,D], `router` [D,E].

Pure functions of arrays and names, for `rljax.models.hf`'s import and export.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np

from rljax.models.config import ModelConfig


class TensorGroup(NamedTuple):
  """Several HF tensors <-> one `MoEMLP` parameter.

  Attributes:
    param: the parameter's path inside the block, e.g. ("gate",) or ("shared", "up").
    hf_names: the checkpoint's tensor names, in the order `from_hf` takes them.
    from_hf: the HF tensors (a list, in `hf_names` order) -> the rljax array.
    to_hf: the rljax array -> the HF tensors (a list, in `hf_names` order).
  """

  param: tuple[str, ...]
  hf_names: tuple[str, ...]
  from_hf: Callable[[list[np.ndarray]], np.ndarray]
  to_hf: Callable[[np.ndarray], list[np.ndarray]]


def _stack_transposed(ws):
  """E tensors [out, in] -> [E, in, out]."""
  return np.stack([w.T for w in ws])


def _unstack_transposed(w):
  """[E, in, out] -> E tensors [out, in]."""
  return [np.ascontiguousarray(x.T) for x in w]


def _one_transposed():
  return (lambda ws: ws[0].T, lambda w: [np.ascontiguousarray(w.T)])


def moe_tensor_groups(cfg: ModelConfig, prefix: str) -> list[TensorGroup]:
  """The mapping of one MoE layer's tensors, for the block at `prefix`.

  Args:
    cfg: a config with num_experts > 0 (shared_expert_intermediate_size > 0: Qwen2-MoE's
      shared expert too).
    prefix: the block's name in the checkpoint, e.g. "model.layers.3.mlp.".
  Returns:
    one `TensorGroup` per `MoEMLP` parameter.
  """
  experts = range(cfg.num_experts)
  names = lambda proj: tuple(f"{prefix}experts.{e}.{proj}_proj.weight" for e in experts)
  groups = [TensorGroup(("router",), (prefix + "gate.weight",), *_one_transposed())]
  groups += [TensorGroup((proj,), names(proj), _stack_transposed, _unstack_transposed)
             for proj in ("gate", "up", "down")]
  if cfg.shared_expert_intermediate_size:
    groups += [TensorGroup(("shared", proj), (f"{prefix}shared_expert.{proj}_proj.weight",),
                           *_one_transposed()) for proj in ("gate", "up", "down")]
    groups.append(TensorGroup(("shared_gate",), (prefix + "shared_expert_gate.weight",),
                              *_one_transposed()))
  return groups


def moe_params_from_hf(tensors: Mapping[str, np.ndarray], cfg: ModelConfig,
                       prefix: str) -> dict[tuple[str, ...], np.ndarray]:
  """One MoE layer's parameters (rljax layout, by path) from a checkpoint's tensors.

  Raises:
    ValueError: a tensor is missing (names it).
  """
  out = {}
  for group in moe_tensor_groups(cfg, prefix):
    missing = [n for n in group.hf_names if n not in tensors]
    if missing:
      raise ValueError(f"MoE tensor {missing[0]!r} missing from the checkpoint "
                       f"({len(missing)} of {len(group.hf_names)} for {'/'.join(group.param)})")
    out[group.param] = group.from_hf([np.asarray(tensors[n]) for n in group.hf_names])
  return out


def moe_params_to_hf(params: Mapping[tuple[str, ...], np.ndarray], cfg: ModelConfig,
                     prefix: str) -> dict[str, np.ndarray]:
  """One MoE layer's checkpoint tensors (HF names and layout) from its parameters by path."""
  out = {}
  for group in moe_tensor_groups(cfg, prefix):
    out.update(zip(group.hf_names, group.to_hf(np.asarray(params[group.param])), strict=True))
  return out


def moe_config_from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
  """The mixture-of-experts `ModelConfig` fields of a Qwen3-MoE / Qwen2-MoE config.json.

  `transformers` 5 writes Qwen3-MoE's expert count as `num_local_experts` (its attribute
  map), the Hub checkpoints as `num_experts`; both are read.

  Returns:
    keyword arguments for `ModelConfig` (empty for a dense config).
  """
  experts = hf.get("num_experts", hf.get("num_local_experts")) or 0
  if not experts:
    return {}
  return dict(num_experts=experts, num_experts_per_tok=hf["num_experts_per_tok"],
              moe_intermediate_size=hf["moe_intermediate_size"],
              norm_topk_prob=bool(hf.get("norm_topk_prob", False)),
              decoder_sparse_step=hf.get("decoder_sparse_step", 1),
              mlp_only_layers=tuple(hf.get("mlp_only_layers") or ()),
              shared_expert_intermediate_size=hf.get("shared_expert_intermediate_size", 0))


def moe_config_to_hf(cfg: ModelConfig) -> dict[str, Any]:
  """The config.json entries for `cfg`'s experts (empty for a dense config)."""
  if not cfg.num_experts:
    return {}
  out = {"num_experts": cfg.num_experts, "num_experts_per_tok": cfg.num_experts_per_tok,
         "moe_intermediate_size": cfg.moe_intermediate_size,
         "norm_topk_prob": cfg.norm_topk_prob, "decoder_sparse_step": cfg.decoder_sparse_step,
         "mlp_only_layers": list(cfg.mlp_only_layers)}
  if cfg.shared_expert_intermediate_size:
    out["shared_expert_intermediate_size"] = cfg.shared_expert_intermediate_size
  return out


def moe_variable(block, path: tuple[str, ...]):
  """The `MoEMLP` Variable at `path` (a `TensorGroup.param`), e.g. block.shared.up."""
  for name in path:
    block = getattr(block, name)
  return block
