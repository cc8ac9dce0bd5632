"""Helpers for tests and benchmarks: tiny configs and cheap weight perturbation."""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx

from rljax.models.config import ModelConfig


def tiny_config(**overrides) -> ModelConfig:
  """vocab 97, width 64, 2 layers, 4 heads x 16, 2 KV heads, MLP 96 (Qwen2 layout)."""
  base = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4,
              num_kv_heads=2, head_dim=16, arch="qwen2", attention_bias=True)
  return ModelConfig(**{**base, **overrides})


def tiny_moe_config(**overrides) -> ModelConfig:
  """`tiny_config` with Qwen3-MoE layers: 4 layers, layer 0 dense (`mlp_only_layers`), the
  others 4 experts of width 32, top 2, normalised weights (Qwen3 layout: q/k norm)."""
  base = dict(num_layers=4, arch="qwen3", attention_bias=False, qk_norm=True, num_experts=4,
              num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True,
              mlp_only_layers=(0,))
  return tiny_config(**{**base, **overrides})


def perturb_params(model: nnx.Module, *, scale: float = 0.1, seed: int = 0) -> nnx.Module:
  """Adds scale·N(0,1) noise (drawn with NumPy, so no per-shape XLA compiles) to every
  parameter, so zero biases and unit norm gains are exercised too. In place; returns model.
  """
  rng = np.random.default_rng(seed)
  state = nnx.state(model, nnx.Param)
  leaves, tree = jax.tree.flatten(state)
  new = [(np.asarray(x, np.float32) + scale * rng.standard_normal(x.shape, np.float32))
         .astype(x.dtype) for x in leaves]
  nnx.update(model, jax.tree.unflatten(tree, new))
  return model
