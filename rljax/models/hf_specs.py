"""The Hugging Face <-> rljax tensor mapping of a decoder: each checkpoint tensor's name, the
rljax parameter (or slice of one) it fills, and the layout conversions both ways. Used by
`rljax.models.hf` to read and write checkpoints."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from flax import nnx

from rljax.models.config import ModelConfig
from rljax.models.decoder import Decoder
from rljax.models.moe_hf import moe_tensor_groups, moe_variable


def index_depth(index) -> int:
  """The leading axes a `TensorSpec` index selects: 0 (None), 1 (an int) or len(tuple)."""
  return 0 if index is None else len(index) if isinstance(index, tuple) else 1


class TensorSpec(NamedTuple):
  """One HF tensor <-> one rljax parameter, or one slice of a stacked parameter (a layer's,
  `ModelConfig.scan_layers`: HF's per-layer tensors are stacked on load, split on save; an
  expert's of a MoE layer's [E, ...] weights)."""

  hf_name: str
  # model -> (the rljax Variable, the tensor's index into its leading axes: a layer's
  # index on the "layers" axis, (layer, expert) or (expert,) for an expert's tensor; None
  # when the tensor is the whole Variable)
  get: Callable[[Decoder], tuple[nnx.Variable, int | tuple | None]]
  from_hf: Callable[[np.ndarray], np.ndarray]  # HF layout -> rljax layout
  to_hf: Callable[[np.ndarray], np.ndarray]  # rljax layout -> HF layout


def identity(x):
  return x


def _in_split(d, *out):
  """HF [prod(out), D] <-> rljax [D, *out] (q/k/v projections)."""
  return (lambda w: w.T.reshape(d, *out), lambda w: w.reshape(d, -1).T)


def _out_split(d, *inp):
  """HF [D, prod(inp)] <-> rljax [*inp, D] (o projection)."""
  return (lambda w: w.T.reshape(*inp, d), lambda w: w.reshape(-1, d).T)


def transpose():
  return (lambda w: w.T, lambda w: w.T)


def _reshape(*shape):
  return (lambda w: w.reshape(shape), lambda w: w.reshape(-1))


def whole(get):
  return lambda m: (get(m), None)


def _in_layer(i, get):
  """Spec getter of layer i's tensor `get(layer module)`, wherever the decoder keeps it."""
  def locate(m):
    module, index = m.locate_layer(i)
    return get(module), index
  return locate


_DENSE_MLP = [(f"mlp.{proj}_proj.weight", lambda L, proj=proj: getattr(L.mlp, proj),
               *transpose()) for proj in ("gate", "up", "down")]


def _layer_tensors(cfg: ModelConfig) -> list[tuple]:
  """(HF name after `model.layers.<i>.`, getter on a layer, from_hf, to_hf) of every
  per-layer tensor but the MLP's."""
  d, h, k, dh = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  out = [
      ("input_layernorm.weight", lambda L: L.attn_norm.scale, identity, identity),
      ("post_attention_layernorm.weight", lambda L: L.mlp_norm.scale, identity, identity),
      ("self_attn.q_proj.weight", lambda L: L.attn.q, *_in_split(d, h, dh)),
      ("self_attn.k_proj.weight", lambda L: L.attn.k, *_in_split(d, k, dh)),
      ("self_attn.v_proj.weight", lambda L: L.attn.v, *_in_split(d, k, dh)),
      ("self_attn.o_proj.weight", lambda L: L.attn.o, *_out_split(d, h, dh)),
  ]
  if cfg.attention_bias:
    out += [("self_attn.q_proj.bias", lambda L: L.attn.q_bias, *_reshape(h, dh)),
            ("self_attn.k_proj.bias", lambda L: L.attn.k_bias, *_reshape(k, dh)),
            ("self_attn.v_proj.bias", lambda L: L.attn.v_bias, *_reshape(k, dh))]
  if cfg.attention_out_bias:
    out.append(("self_attn.o_proj.bias", lambda L: L.attn.o_bias, identity, identity))
  if cfg.qk_norm:
    out += [("self_attn.q_norm.weight", lambda L: L.attn.q_norm.scale, identity, identity),
            ("self_attn.k_norm.weight", lambda L: L.attn.k_norm.scale, identity, identity)]
  return out


def _expert(get, e):
  """Spec getter of expert e's slice of the Variable `get` returns (leading axes: the
  layers' when stacked, then the experts')."""
  def locate(m):
    var, index = get(m)
    return var, (e,) if index is None else (index, e)
  return locate


def _moe_specs(cfg: ModelConfig, layers) -> list[TensorSpec]:
  """The MoE layers' tensors (`rljax.models.moe_hf`): per parameter, per layer, one spec per
  HF tensor (an expert's slice of the stacked [E, ...] weight, or a whole router)."""
  specs = []
  for g, group in enumerate(moe_tensor_groups(cfg, "")):
    for i in layers:
      names = moe_tensor_groups(cfg, f"model.layers.{i}.mlp.")[g].hf_names
      get = _in_layer(i, lambda L, path=group.param: moe_variable(L.mlp, path))
      if len(names) == 1:
        specs.append(TensorSpec(names[0], get, lambda w, g=group: g.from_hf([w]),
                                lambda w, g=group: g.to_hf(w)[0]))
        continue
      specs += [TensorSpec(name, _expert(get, e), lambda w, g=group: g.from_hf([w])[0],
                           lambda w, g=group: g.to_hf(w[None])[0])
                for e, name in enumerate(names)]
  return specs


def tensor_specs(cfg: ModelConfig) -> list[TensorSpec]:
  """The full HF <-> rljax name and layout mapping for `cfg`.

  Per-layer tensors come parameter by parameter (every layer's q_proj, then every layer's
  k_proj, ...), so a stacked parameter is read, or written, whole before the next one.
  Dense layers have the MLP's three projections, MoE layers (`cfg.is_moe_layer`) a
  router and every expert's projections.
  """
  specs = [TensorSpec("model.embed_tokens.weight", whole(lambda m: m.embed), identity,
                      identity),
           TensorSpec("model.norm.weight", whole(lambda m: m.final_norm.scale), identity,
                      identity)]
  if not cfg.tie_embeddings:
    specs.append(TensorSpec("lm_head.weight", whole(lambda m: m.lm_head), *transpose()))
  moe = [i for i in range(cfg.num_layers) if cfg.is_moe_layer(i)]
  dense = [i for i in range(cfg.num_layers) if not cfg.is_moe_layer(i)]
  for suffix, get, from_hf, to_hf in _layer_tensors(cfg):
    specs += [TensorSpec(f"model.layers.{i}.{suffix}", _in_layer(i, get), from_hf, to_hf)
              for i in range(cfg.num_layers)]
  for suffix, get, from_hf, to_hf in _DENSE_MLP:
    specs += [TensorSpec(f"model.layers.{i}.{suffix}", _in_layer(i, get), from_hf, to_hf)
              for i in dense]
  return specs + _moe_specs(cfg, moe)
