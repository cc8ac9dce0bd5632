"""MoE block vs `transformers`' Qwen3-MoE / Qwen2-MoE sparse blocks on the same random
weights; a saved Qwen3MoeForCausalLM's expert tensors map into the block and back."""

import json

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from safetensors.numpy import load_file
from tolerances import assert_close_f32
from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeSparseMoeBlock
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

from rljax.models import ModelConfig
from rljax.models.moe import MoEMLP
from rljax.models.moe_hf import (
  moe_config_from_hf,
  moe_config_to_hf,
  moe_params_from_hf,
  moe_params_to_hf,
  moe_tensor_groups,
  moe_variable,
)

HF = dict(hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_experts=8,
          num_experts_per_tok=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8)


def _hf_block(kind, norm, seed=0, implementation="eager"):
  if kind == "qwen3":
    config = transformers.Qwen3MoeConfig(**HF, norm_topk_prob=norm)
    cls = Qwen3MoeSparseMoeBlock
  else:
    config = transformers.Qwen2MoeConfig(**HF, norm_topk_prob=norm,
                                         shared_expert_intermediate_size=24)
    cls = Qwen2MoeSparseMoeBlock
  config._experts_implementation = implementation
  torch.manual_seed(seed)
  block = cls(config).eval()
  with torch.no_grad():
    for p in block.parameters():
      p.copy_(0.3 * torch.randn_like(p))
  return config, block


def _copy_into(block_hf, block, cfg):
  """The torch block's weights -> the rljax block, through the checkpoint layout (the fused
  in-memory gate_up_proj [E,2F,D] split into per-expert tensors, as save_pretrained writes)."""
  f = cfg.moe_intermediate_size
  sd = {k: v.detach().numpy() for k, v in block_hf.state_dict().items()}
  tensors = {"mlp.gate.weight": sd["gate.weight"]}
  for e in range(cfg.num_experts):
    tensors[f"mlp.experts.{e}.gate_proj.weight"] = sd["experts.gate_up_proj"][e, :f]
    tensors[f"mlp.experts.{e}.up_proj.weight"] = sd["experts.gate_up_proj"][e, f:]
    tensors[f"mlp.experts.{e}.down_proj.weight"] = sd["experts.down_proj"][e]
  tensors.update({f"mlp.{k}": v for k, v in sd.items() if k.startswith("shared_expert")})
  for path, value in moe_params_from_hf(tensors, cfg, "mlp.").items():
    moe_variable(block, path).set_value(jnp.asarray(value))


@pytest.mark.parametrize("kind,norm,implementation", [
    ("qwen3", True, "eager"), ("qwen3", False, "grouped_mm"), ("qwen2", False, "eager")])
def test_block_matches_transformers(kind, norm, implementation):
  config, block_hf = _hf_block(kind, norm, implementation=implementation)
  cfg = ModelConfig(vocab_size=11, num_layers=1, hidden_size=HF["hidden_size"],
                    intermediate_size=HF["intermediate_size"], num_heads=4,
                    **moe_config_from_hf(config.to_dict()))
  assert cfg.norm_topk_prob == norm and cfg.num_experts == 8
  assert bool(cfg.shared_expert_intermediate_size) == (kind == "qwen2")
  block = MoEMLP(cfg, rngs=nnx.Rngs(0))
  _copy_into(block_hf, block, cfg)
  x = np.random.default_rng(1).standard_normal((3, 9, HF["hidden_size"])).astype(np.float32)
  with torch.no_grad():
    want = block_hf(torch.tensor(x)).numpy()
    _, _, want_ids = block_hf.gate(torch.tensor(x).reshape(-1, HF["hidden_size"]))
  got, routing = block(jnp.asarray(x))
  np.testing.assert_array_equal(np.asarray(routing.expert_ids).reshape(-1, 2),
                                want_ids.numpy())
  print(f"{kind} norm={norm} {implementation}: max|Δ| = {np.max(np.abs(got - want)):.3g}, "
        f"max|y| = {np.max(np.abs(want)):.3g}")
  assert_close_f32(got, want, ulps=256)   # two programs: matmuls, softmax, weighted sum


def _tiny_checkpoint(tmp_path):
  config = transformers.Qwen3MoeConfig(
      vocab_size=64, hidden_size=16, intermediate_size=32, moe_intermediate_size=8,
      num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
      num_experts=4, num_experts_per_tok=2, norm_topk_prob=True, mlp_only_layers=[1])
  torch.manual_seed(0)
  transformers.Qwen3MoeForCausalLM(config).save_pretrained(tmp_path)
  with open(tmp_path / "config.json") as f:
    return json.load(f), load_file(tmp_path / "model.safetensors")


def test_checkpoint_tensors_round_trip(tmp_path):
  hf_config, tensors = _tiny_checkpoint(tmp_path)
  assert "num_local_experts" in hf_config   # transformers 5 writes the attribute-mapped name
  cfg = ModelConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_layers=3,
                    num_heads=2, **moe_config_from_hf(hf_config))
  assert [cfg.is_moe_layer(i) for i in range(3)] == [True, False, True]
  moe_names = {k for k in tensors if ".mlp.experts." in k or k.endswith(".mlp.gate.weight")}
  mapped = set()
  for i in (0, 2):
    prefix = f"model.layers.{i}.mlp."
    block = MoEMLP(cfg, rngs=nnx.Rngs(i))
    for path, value in moe_params_from_hf(tensors, cfg, prefix).items():
      moe_variable(block, path).set_value(jnp.asarray(value))
    e = 3   # a spot check of the layout: expert 3's gate projection, transposed
    np.testing.assert_array_equal(
        block.gate[e], tensors[f"{prefix}experts.{e}.gate_proj.weight"].T)
    params = {g.param: np.asarray(moe_variable(block, g.param)[...])
              for g in moe_tensor_groups(cfg, prefix)}
    back = moe_params_to_hf(params, cfg, prefix)
    for name, value in back.items():
      np.testing.assert_array_equal(value, tensors[name], err_msg=name)
    mapped |= set(back)
  assert mapped == moe_names   # every expert and router tensor, nothing else
  written = moe_config_to_hf(cfg)
  assert {k: hf_config[k] for k in written if k != "num_experts"} == \
      {k: v for k, v in written.items() if k != "num_experts"}
  assert written["num_experts"] == hf_config["num_local_experts"]


def test_missing_expert_tensor_is_named(tmp_path):
  hf_config, tensors = _tiny_checkpoint(tmp_path)
  cfg = ModelConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_layers=3,
                    num_heads=2, **moe_config_from_hf(hf_config))
  del tensors["model.layers.2.mlp.experts.1.up_proj.weight"]
  with pytest.raises(ValueError, match="experts.1.up_proj"):
    moe_params_from_hf(tensors, cfg, "model.layers.2.mlp.")
