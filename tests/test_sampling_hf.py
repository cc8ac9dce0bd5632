"""Greedy generate() is token-identical to transformers' greedy `generate` (same weights)."""

import jax
import numpy as np
import pytest
import torch
import transformers
from tolerances import assert_close_f32

from rljax.models import load_hf
from rljax.sampling import SamplingParams, generate

BASE = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6,
            max_position_embeddings=64, rope_theta=10000.0, tie_word_embeddings=False)
ARCHS = {"qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
         "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM)}
PAD, T = 0, 12


def _hf_model(arch):
  config_cls, model_cls = ARCHS[arch]
  torch.manual_seed(0)
  model = model_cls(config_cls(**BASE, pad_token_id=PAD)).eval()
  with torch.no_grad():  # spread the logits: random-init logits are nearly uniform
    for p in model.parameters():
      p.add_(0.1 * torch.randn_like(p))
  return model


def _prompts():
  rng = np.random.default_rng(0)
  lengths = [7, 4, 1, 5]
  mask = (np.arange(7)[None] >= 7 - np.array(lengths)[:, None]).astype(np.int64)
  return rng.integers(1, 97, size=mask.shape) * mask, mask


def _hf_greedy(hf, tokens, mask, stop):
  with torch.no_grad():
    out = hf.generate(torch.tensor(tokens), attention_mask=torch.tensor(mask), do_sample=False,
                      max_new_tokens=T, eos_token_id=stop, pad_token_id=PAD,
                      output_logits=True, return_dict_in_generate=True)
  new = out.sequences[:, tokens.shape[1]:].numpy()
  logits = torch.stack(out.logits, dim=1).float().numpy()    # [B, T', V]
  return np.pad(new, ((0, 0), (0, T - new.shape[1])), constant_values=PAD), logits


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_greedy_matches_transformers_generate(arch, tmp_path):
  hf = _hf_model(arch)
  hf.save_pretrained(tmp_path)
  model, _ = load_hf(str(tmp_path))
  tokens, mask = _prompts()
  free, _ = _hf_greedy(hf, tokens, mask, stop=None)
  stop = int(free[0, 3])          # a token row 0 emits mid-way; others may or may not
  want, hf_logits = _hf_greedy(hf, tokens, mask, stop=stop)
  got = generate(model, tokens, mask, sampling=SamplingParams(
      max_new_tokens=T, greedy=True, stop_tokens=(stop,)), rng=jax.random.key(0), pad_id=PAD)
  np.testing.assert_array_equal(np.asarray(got.tokens), want)
  hit = want == stop
  assert hit[0].any() and not hit.any(axis=1).all(), "want both stopped and unstopped rows"
  for b in range(len(want)):
    end = np.argmax(hit[b]) + 1 if hit[b].any() else T
    np.testing.assert_array_equal(np.asarray(got.mask)[b], np.arange(T) < end)
  np.testing.assert_array_equal(got.truncated, ~hit.any(axis=1))
  # log-probs of the chosen tokens under the HF logits (untruncated, temperature 1)
  hf_logp = torch.log_softmax(torch.tensor(hf_logits), -1).numpy()
  t = hf_logits.shape[1]
  chosen = np.take_along_axis(hf_logp, want[:, :t, None], -1)[..., 0]
  m = np.asarray(got.mask)[:, :t] > 0
  # JAX cached decode vs torch full forward: other sums
  assert_close_f32(np.asarray(got.logp_full)[:, :t][m], chosen[m], ulps=256)
  assert np.all(np.asarray(got.logp) == 0)         # greedy: point mass
