"""Qwen3-MoE / Qwen2-MoE checkpoints: logits and a greedy step equal transformers', config
and tensors round-trip, LoRA adapts attention only and PEFT loads its adapter."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from safetensors.numpy import load_file
from tolerances import assert_close_f32

from rljax.models import Decoder, add_lora, config_from_hf, load_hf, save_hf, save_peft_adapter
from rljax.models.lora import adapters
from rljax.models.testing import perturb_params, tiny_moe_config
from rljax.sampling import SamplingParams, generate

BASE = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
            max_position_embeddings=64, rope_theta=10000.0, tie_word_embeddings=False,
            num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, pad_token_id=0)
CASES = {
    # layer 0 dense (mlp_only_layers), 1-2 MoE; normalised top-k weights
    "qwen3_moe": (transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM,
                  dict(norm_topk_prob=True, mlp_only_layers=[0])),
    # every second layer MoE (layer 1), with the sigmoid-gated shared expert
    "qwen2_moe": (transformers.Qwen2MoeConfig, transformers.Qwen2MoeForCausalLM,
                  dict(norm_topk_prob=False, decoder_sparse_step=2,
                       shared_expert_intermediate_size=48)),
}


def _hf_model(case, seed=0):
  config_cls, model_cls, extra = CASES[case]
  torch.manual_seed(seed)
  model = model_cls(config_cls(**{**BASE, **extra})).eval()
  with torch.no_grad():  # every tensor perturbed: norms, router, experts not trivial
    for p in model.parameters():
      p.add_(0.1 * torch.randn_like(p))
  return model


def _batch(seed=0, b=3, s=9):
  rng = np.random.default_rng(seed)
  mask = (np.arange(s)[None] >= s - np.array([s, 5, 2])[:b, None]).astype(np.int64)
  tokens = rng.integers(1, 97, size=(b, s)) * mask
  return tokens, np.maximum(np.cumsum(mask, axis=1) - 1, 0), mask


def _hf_logits(hf, tokens, positions, mask):
  with torch.no_grad():
    return hf(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask),
              position_ids=torch.tensor(positions)).logits.float().numpy()


def _logits(model, tokens, positions, mask):
  args = [jnp.asarray(x, jnp.int32) for x in (tokens, positions, mask)]
  return np.asarray(nnx.jit(lambda m, t, p, a: m(t, positions=p, attention_mask=a))(
      model, *args))


@pytest.mark.parametrize("scan_layers", [True, False])
@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_equal_transformers(case, scan_layers, tmp_path):
  hf = _hf_model(case)
  hf.save_pretrained(tmp_path)
  model, cfg = load_hf(str(tmp_path), scan_layers=scan_layers)
  assert cfg.num_experts == 4 and model.num_moe_layers == (2 if case == "qwen3_moe" else 1)
  assert bool(cfg.shared_expert_intermediate_size) == (case == "qwen2_moe")
  tokens, positions, mask = _batch()
  want = _hf_logits(hf, tokens, positions, mask)
  got = _logits(model, tokens, positions, mask)
  real = mask > 0
  # JAX vs torch: other matmul/attention/softmax sums (the routes agree: no near-tie here)
  assert_close_f32(got[real], want[real], ulps=256)


def test_one_greedy_generation_step_equals_transformers(tmp_path):
  hf = _hf_model("qwen3_moe", seed=1)
  hf.save_pretrained(tmp_path)
  model, _ = load_hf(str(tmp_path))
  tokens, _, mask = _batch(seed=1)
  with torch.no_grad():
    out = hf.generate(torch.tensor(tokens), attention_mask=torch.tensor(mask), do_sample=False,
                      max_new_tokens=2, pad_token_id=0, output_logits=True,
                      return_dict_in_generate=True)
  want = out.sequences[:, tokens.shape[1]:].numpy()
  got = generate(model, tokens, mask, sampling=SamplingParams(max_new_tokens=2, greedy=True),
                 rng=jax.random.key(0))
  np.testing.assert_array_equal(np.asarray(got.tokens), want)
  hf_logp = torch.log_softmax(torch.stack(out.logits, 1).float(), -1).numpy()
  chosen = np.take_along_axis(hf_logp, want[..., None], -1)[..., 0]
  assert_close_f32(np.asarray(got.logp_full), chosen, ulps=256)   # cached JAX vs torch


@pytest.mark.parametrize("case", sorted(CASES))
def test_save_load_round_trip_writes_the_checkpoints_tensors(case, tmp_path):
  hf = _hf_model(case, seed=2)
  hf.save_pretrained(tmp_path / "in")
  model, cfg = load_hf(str(tmp_path / "in"))
  save_hf(model, cfg, str(tmp_path / "out"))
  want = load_file(str(tmp_path / "in" / "model.safetensors"))
  got = load_file(str(tmp_path / "out" / "model.safetensors"))
  assert sorted(got) == sorted(want)
  assert "model.layers.1.mlp.experts.3.down_proj.weight" in got
  for name in want:
    np.testing.assert_array_equal(got[name], want[name], err_msg=name)
  # transformers reads the written config back to the same architecture and routing
  again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
  assert type(again).__name__ == type(hf).__name__
  assert config_from_hf(again.config.to_dict()) == cfg
  tokens, positions, mask = _batch(seed=2)
  np.testing.assert_array_equal(_hf_logits(again, tokens, positions, mask),
                                _hf_logits(hf, tokens, positions, mask))


def test_a_random_rljax_moe_model_exports_to_transformers(tmp_path):
  cfg = tiny_moe_config(num_layers=3, decoder_sparse_step=1)
  model = perturb_params(Decoder(cfg, rngs=nnx.Rngs(3)), scale=0.05, seed=3)
  save_hf(model, cfg, str(tmp_path))
  hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
  assert type(hf).__name__ == "Qwen3MoeForCausalLM"
  tokens, positions, mask = _batch(seed=3)
  want, got = _hf_logits(hf, tokens, positions, mask), _logits(model, tokens, positions, mask)
  assert_close_f32(got[mask > 0], want[mask > 0], ulps=256)   # JAX vs torch, as above


def _peft_keys(hf, targets):
  import peft

  config = peft.LoraConfig(r=2, lora_alpha=4, target_modules=targets)
  return sorted(peft.get_peft_model_state_dict(peft.get_peft_model(hf, config)))


def test_lora_on_attention_matches_peft_and_trains_adapters_only(tmp_path):
  """q/k/v/o on Qwen3-MoE: the adapter's tensor names are PEFT's own for those targets,
  PEFT loads it with the same logits, only adapters receive a gradient; gate/up/down (which
  PEFT reads as the fused experts) are refused by name."""
  import peft

  hf = _hf_model("qwen3_moe", seed=4)
  hf.save_pretrained(tmp_path / "base")
  model, cfg = load_hf(str(tmp_path / "base"))
  with pytest.raises(ValueError, match=r"\['gate', 'up', 'down'\].*model.lora_targets"):
    add_lora(model, rank=2, alpha=4.0, rngs=nnx.Rngs(1))
  add_lora(model, rank=2, alpha=4.0, targets=("q", "k", "v", "o"), rngs=nnx.Rngs(1))
  rng = np.random.default_rng(5)
  for adapter in adapters(model).values():
    adapter.b[...] = jnp.asarray(0.3 * rng.standard_normal(adapter.b[...].shape), jnp.float32)
  save_peft_adapter(model, cfg, str(tmp_path / "adapter"))
  names = sorted(load_file(str(tmp_path / "adapter" / "adapter_model.safetensors")))
  assert names == _peft_keys(transformers.AutoModelForCausalLM.from_pretrained(
      tmp_path / "base"), ["q_proj", "k_proj", "v_proj", "o_proj"])
  peft_model = peft.PeftModel.from_pretrained(
      transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base"),
      tmp_path / "adapter").eval()
  tokens, positions, mask = _batch(seed=4)
  want = _hf_logits(peft_model, tokens, positions, mask)
  assert_close_f32(_logits(model, tokens, positions, mask)[mask > 0], want[mask > 0],
                   ulps=256)   # JAX vs torch, as above
  assert np.abs(want - _hf_logits(hf, tokens, positions, mask)).max() > 1e-2   # it matters
  graphdef, lora, rest = nnx.split(model, nnx.LoRAParam, ...)
  paths = ["/".join(map(str, p)) for p, _ in nnx.to_flat_state(lora)]
  assert paths and all("/attn/" in p for p in paths)

  def loss(lora):
    m = nnx.merge(graphdef, lora, rest)
    return jnp.sum(m(jnp.asarray(tokens, jnp.int32), attention_mask=jnp.asarray(mask)) ** 2)
  grads = jax.grad(loss)(lora)
  assert all(float(jnp.abs(g).max()) > 0 for g in jax.tree.leaves(grads))
