"""Hugging Face parity: transformers' PyTorch models vs rljax, import, export, errors."""

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from safetensors.numpy import load_file, save_file
from tolerances import assert_close_f32, f32_atol

from rljax.models import Decoder, ModelConfig, load_hf, save_hf
from rljax.models.hf import tensor_specs
from rljax.models.testing import perturb_params

BASE = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6,
            max_position_embeddings=64, rope_theta=10000.0)
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 4,
               "rope_theta": 500.0}
CASES = {
    "llama_gqa_untied": (transformers.LlamaConfig, dict(tie_word_embeddings=False)),
    "llama_mqa_tied_rope3": (transformers.LlamaConfig,
                             dict(tie_word_embeddings=True, num_key_value_heads=1,
                                  rope_parameters=LLAMA3_ROPE)),
    "qwen2_gqa_untied": (transformers.Qwen2Config, dict(tie_word_embeddings=False)),
    "qwen2_mha_tied": (transformers.Qwen2Config,
                       dict(tie_word_embeddings=True, num_key_value_heads=4)),
    "qwen3_gqa_untied": (transformers.Qwen3Config, dict(tie_word_embeddings=False, head_dim=24)),
    "qwen3_gqa_tied": (transformers.Qwen3Config, dict(tie_word_embeddings=True, head_dim=16)),
}
_CLASSES = {transformers.LlamaConfig: transformers.LlamaForCausalLM,
            transformers.Qwen2Config: transformers.Qwen2ForCausalLM,
            transformers.Qwen3Config: transformers.Qwen3ForCausalLM}


def _hf_model(case, seed=0):
  config_cls, extra = CASES[case]
  config = config_cls(**{**BASE, **extra})
  torch.manual_seed(seed)
  model = _CLASSES[config_cls](config).eval()
  with torch.no_grad():  # perturb every tensor so norms and biases are not trivial
    for p in model.parameters():
      p.add_(0.05 * torch.randn_like(p))
  return model


def _batch(seed=0, b=3, s=7, vocab=97):
  rng = np.random.default_rng(seed)
  lengths = np.array([s, 4, 1])[:b]
  mask = (np.arange(s)[None] >= s - lengths[:, None]).astype(np.int64)
  tokens = rng.integers(1, vocab, size=(b, s)) * mask
  positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
  return tokens, positions, mask


def _hf_logits(hf_model, tokens, positions, mask):
  with torch.no_grad():
    out = hf_model(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask),
                   position_ids=torch.tensor(positions))
  return out.logits.float().numpy()


@nnx.jit
def _logits(model, tokens, positions, mask):
  return model(tokens, positions=positions, attention_mask=mask)


def _rl_logits(model, tokens, positions, mask):
  return np.asarray(_logits(model, *(jnp.asarray(x, jnp.int32) for x in (tokens, positions,
                                                                         mask))))


def _max_err(a, b, mask):
  real = mask.astype(bool)
  return float(np.max(np.abs(a[real] - b[real])))


@pytest.mark.parametrize("case", sorted(CASES))
def test_import_parity(case, tmp_path):
  hf_model = _hf_model(case)
  hf_model.save_pretrained(tmp_path)
  model, cfg = load_hf(str(tmp_path))
  assert cfg.tie_embeddings == hf_model.config.tie_word_embeddings
  tokens, positions, mask = _batch()
  want = _hf_logits(hf_model, tokens, positions, mask)
  err = _max_err(_rl_logits(model, tokens, positions, mask), want, mask)
  # JAX vs torch: other matmul/attention/softmax sums, a few hundred eps32 of the logits
  assert err < f32_atol(want[mask > 0], ulps=256), err


def test_llama3_rope_scaling_changes_logits_and_matches(tmp_path):
  """The scaled RoPE must actually differ from unscaled at these positions (relation test)."""
  hf_model = _hf_model("llama_mqa_tied_rope3")
  hf_model.save_pretrained(tmp_path)
  model, cfg = load_hf(str(tmp_path))
  assert cfg.rope_scaling is not None and cfg.rope_scaling.original_max_position_embeddings == 4
  unscaled = Decoder(cfg.replace(rope_scaling=None), rngs=nnx.Rngs(0))
  nnx.update(unscaled, nnx.state(model))
  tokens, positions, mask = _batch()
  diff = _max_err(_rl_logits(model, tokens, positions, mask),
                  _rl_logits(unscaled, tokens, positions, mask), mask)
  assert diff > 1e-3


def test_sharded_checkpoint_loads(tmp_path):
  hf_model = _hf_model("qwen2_gqa_untied", seed=1)
  hf_model.save_pretrained(tmp_path, max_shard_size="40KB")
  assert os.path.exists(tmp_path / "model.safetensors.index.json")
  assert len(list(tmp_path.glob("*.safetensors"))) > 1
  model, _ = load_hf(str(tmp_path))
  tokens, positions, mask = _batch(1)
  want = _hf_logits(hf_model, tokens, positions, mask)
  err = _max_err(_rl_logits(model, tokens, positions, mask), want, mask)
  assert err < f32_atol(want[mask > 0], ulps=256), err   # JAX vs torch, as above
  # dtype= sets the compute dtype; parameters stay float32 unless param_dtype is given
  model16, cfg16 = load_hf(str(tmp_path), dtype="bfloat16")
  assert cfg16.dtype == "bfloat16" and model16.embed[...].dtype == jnp.float32
  assert _max_err(_rl_logits(model16, tokens, positions, mask), want, mask) < 0.05


def _random_rljax(cfg, seed):
  return perturb_params(Decoder(cfg, rngs=nnx.Rngs(seed)), scale=0.05, seed=seed)


EXPORT_CASES = {
    "qwen2_nobias": ModelConfig(vocab_size=97, hidden_size=64, intermediate_size=96,
                                num_layers=2, num_heads=4, num_kv_heads=2, arch="qwen2"),
    "llama_rope3_tied": ModelConfig(vocab_size=97, hidden_size=64, intermediate_size=96,
                                    num_layers=2, num_heads=4, num_kv_heads=1, arch="llama",
                                    tie_embeddings=True, rope_theta=500.0,
                                    rope_scaling={"factor": 8.0, "low_freq_factor": 1.0,
                                                  "high_freq_factor": 4.0,
                                                  "original_max_position_embeddings": 4}),
    "qwen3_bf16": ModelConfig(vocab_size=97, hidden_size=64, intermediate_size=96,
                              num_layers=2, num_heads=4, num_kv_heads=2, head_dim=24,
                              qk_norm=True, arch="qwen3", param_dtype="bfloat16"),
}


@pytest.mark.parametrize("case", sorted(EXPORT_CASES))
def test_export_round_trip(case, tmp_path):
  cfg = EXPORT_CASES[case]
  model = _random_rljax(cfg, 3)
  save_hf(model, cfg, str(tmp_path))
  hf_model = transformers.AutoModelForCausalLM.from_pretrained(
      str(tmp_path), dtype=torch.float32).eval()
  assert type(hf_model).__name__.lower().startswith(cfg.arch)
  tokens, positions, mask = _batch(2)
  ours = _rl_logits(model, tokens, positions, mask)
  err = _max_err(ours, _hf_logits(hf_model, tokens, positions, mask), mask)
  assert err < f32_atol(ours[mask > 0], ulps=256), err   # JAX vs torch, as above
  # and back into rljax: parameters bit-identical (also for bf16 storage)
  again, cfg2 = load_hf(str(tmp_path), param_dtype=cfg.param_dtype)
  for spec in tensor_specs(cfg):
    a, b = _tensor(spec, model), _tensor(spec, again)
    assert a.dtype == b.dtype, spec.hf_name
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=spec.hf_name)
  if cfg.arch == "qwen2" and not cfg.attention_bias:  # zero-filled on export
    q_bias = again.layer_list()[0].attn.q_bias[...]
    assert cfg2.attention_bias and not np.any(np.asarray(q_bias))


def _tensor(spec, model):
  """The rljax side of one HF tensor (a layer's slice of a stacked parameter)."""
  var, index = spec.get(model)
  return var[...] if index is None else var[...][index]


def test_scanned_and_per_layer_decoders_load_and_save_the_same_tensors(tmp_path):
  """`scan_layers` stacks HF's per-layer tensors on load and splits them on save: the same
  values, logits and safetensors file (names, shapes, bytes) as one module per layer."""
  hf_model = _hf_model("qwen3_gqa_untied", seed=2)
  hf_model.save_pretrained(tmp_path / "in")
  scanned, cfg = load_hf(str(tmp_path / "in"))
  looped, cfg_looped = load_hf(str(tmp_path / "in"), scan_layers=False)
  assert cfg.scan_layers and not cfg_looped.scan_layers
  assert scanned.layers[0].layer.attn.q[...].shape == (cfg.num_layers, 64, 4, 24)
  assert looped.layers[1].attn.q[...].shape == (64, 4, 24)
  for spec in tensor_specs(cfg):
    np.testing.assert_array_equal(_tensor(spec, scanned), _tensor(spec, looped),
                                  err_msg=spec.hf_name)
  tokens, positions, mask = _batch(3)
  want = _hf_logits(hf_model, tokens, positions, mask)
  for model in (scanned, looped):   # JAX vs torch, as above
    err = _max_err(_rl_logits(model, tokens, positions, mask), want, mask)
    assert err < f32_atol(want[mask > 0], ulps=256), err
  save_hf(scanned, cfg, str(tmp_path / "scanned"))
  save_hf(looped, cfg_looped, str(tmp_path / "looped"))
  written = [load_file(str(tmp_path / d / "model.safetensors")) for d in ("scanned", "looped")]
  assert sorted(written[0]) == sorted(written[1]) == sorted(load_file(
      str(tmp_path / "in" / "model.safetensors")))
  assert ((tmp_path / "scanned" / "model.safetensors").read_bytes()
          == (tmp_path / "looped" / "model.safetensors").read_bytes())


def test_unsupported_architecture_error(tmp_path):
  hf_model = _hf_model("llama_gqa_untied")
  hf_model.save_pretrained(tmp_path)
  config = json.loads((tmp_path / "config.json").read_text())
  config["architectures"] = ["MistralForCausalLM"]
  (tmp_path / "config.json").write_text(json.dumps(config))
  with pytest.raises(ValueError, match="MistralForCausalLM"):
    load_hf(str(tmp_path))


def test_missing_tensor_error(tmp_path):
  hf_model = _hf_model("qwen3_gqa_tied")
  hf_model.save_pretrained(tmp_path)
  tensors = load_file(str(tmp_path / "model.safetensors"))
  del tensors["model.layers.1.self_attn.k_norm.weight"]
  save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
  with pytest.raises(ValueError, match=r"model\.layers\.1\.self_attn\.k_norm\.weight"):
    load_hf(str(tmp_path))


def test_reward_model_import_parity_and_export(tmp_path):
  """HF *ForSequenceClassification pools at the last non-pad token; rljax scores there."""
  from rljax.models import ValueModel, load_hf_reward, save_hf_reward
  from rljax.models.heads import last_token_index

  config = transformers.Qwen3Config(**{**BASE, "head_dim": 16, "num_labels": 1,
                                       "pad_token_id": 0})
  torch.manual_seed(5)
  hf_rm = transformers.Qwen3ForSequenceClassification(config).eval()
  with torch.no_grad():
    for p in hf_rm.parameters():
      p.add_(0.05 * torch.randn_like(p))
  hf_rm.save_pretrained(tmp_path / "in")
  rm, cfg = load_hf_reward(str(tmp_path / "in"))
  tokens, positions, mask = _batch(4)
  with torch.no_grad():
    want = hf_rm(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask),
                 position_ids=torch.tensor(positions)).logits[:, 0].numpy()
  args = [jnp.asarray(x, jnp.int32) for x in (tokens, positions, mask)]
  score = nnx.jit(lambda m, t, p, a: m.score(t, p, a, last_token_index(a)))
  got = np.asarray(score(rm, *args))
  assert_close_f32(got, want, ulps=256)   # JAX vs torch: other sums in the trunk and head
  save_hf_reward(rm, cfg, str(tmp_path / "out"))
  hf_again = transformers.AutoModelForSequenceClassification.from_pretrained(
      str(tmp_path / "out"), dtype=torch.float32).eval()
  with torch.no_grad():
    again = hf_again(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask),
                     position_ids=torch.tensor(positions)).logits[:, 0].numpy()
  assert_close_f32(again, want, ulps=256)
  # critic initialised from the imported reward model: values at EOS == rewards
  critic = ValueModel.from_reward_model(rm)
  values = nnx.jit(lambda m, t, p, a: m(t, positions=p, attention_mask=a))(critic, *args)
  assert_close_f32(np.asarray(values)[np.arange(3), np.asarray(last_token_index(args[2]))], got,
                   ulps=256)   # the critic's per-token program vs the scorer's
