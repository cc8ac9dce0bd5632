"""LoRA adapters: every entry point sees them, merged == unmerged, the reference with the
adapters off is the base, and PEFT / transformers load what rljax exports."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from tolerances import assert_close_f32

from rljax.models import (
    Decoder,
    adapters_off,
    add_lora,
    load_hf,
    load_peft_adapter,
    save_hf,
    save_peft_adapter,
)
from rljax.models.lora import adapters, merge_lora
from rljax.models.stack import stack_like
from rljax.models.testing import perturb_params, tiny_config


def _batch(b=3, s=9, vocab=97, seed=0):
  rng = np.random.default_rng(seed)
  lengths = np.array([s, 5, 2])[:b]
  mask = (np.arange(s)[None] >= s - lengths[:, None]).astype(np.int32)
  tokens = (rng.integers(1, vocab, (b, s)) * mask).astype(np.int32)
  return jnp.asarray(tokens), jnp.asarray(mask)


def _lora_model(seed=0, rank=4, targets=("q", "k", "v", "o", "gate", "up", "down"), **cfg):
  model = perturb_params(Decoder(tiny_config(**cfg), rngs=nnx.Rngs(seed)), seed=seed)
  base = nnx.clone(model)
  add_lora(model, rank=rank, alpha=8.0, targets=targets, rngs=nnx.Rngs(seed + 1))
  return base, model


def _randomise_b(model, seed=0, scale=0.3):
  rng = np.random.default_rng(seed)
  for adapter in adapters(model).values():
    adapter.b[...] = jnp.asarray(scale * rng.standard_normal(adapter.b[...].shape), jnp.float32)


@pytest.mark.parametrize("scan_layers", [True, False])
def test_adapter_count_dtype_and_axes(scan_layers):
  _, model = _lora_model(scan_layers=scan_layers)
  found = adapters(model)
  lora = nnx.state(model, nnx.LoRAParam)
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(lora))
  if scan_layers:   # one stacked adapter per target, both layers on the leading axis
    assert len(found) == 7 and len(jax.tree.leaves(lora)) == 2 * 7
    q, o, lead, axis = found[(0, "q")], found[(0, "o")], (2,), ("layers",)
  else:
    assert len(found) == 7 * 2 and len(jax.tree.leaves(lora)) == 2 * 14
    q, o, lead, axis = found[(0, "q")], found[(1, "o")], (), ()
  assert q.a[...].shape == (*lead, 64, 4) and q.b[...].shape == (*lead, 4, 4, 16)
  assert q.a.get_metadata()["out_sharding"] == (*axis, "embed", "lora")
  assert q.b.get_metadata()["out_sharding"] == (*axis, "lora", "heads", "kv")
  assert o.a[...].shape == (*lead, 4, 16, 4) and o.b[...].shape == (*lead, 4, 64)
  with pytest.raises(ValueError, match="one of"):
    add_lora(Decoder(tiny_config(), rngs=nnx.Rngs(0)), rank=2, alpha=1, targets=("qkv",),
             rngs=nnx.Rngs(0))


def test_scanned_adapters_are_the_per_layer_adapters_stacked(tmp_path):
  """The same seeds give a scanned LoRA model the same A as the per-layer one (stacked);
  with the same parameters both give the same logits, merged weights and PEFT files."""
  _, scanned = _lora_model(seed=2)
  _, looped = _lora_model(seed=2, scan_layers=False)
  per_layer = adapters(looped)
  for (first, name), adapter in adapters(scanned).items():
    np.testing.assert_array_equal(adapter.a[...], np.stack(
        [per_layer[(first + j, name)].a[...] for j in range(2)]))
  _randomise_b(looped, seed=3)
  # (perturb_params drew other noise for the stacked leaves: take the base and B too)
  nnx.update(scanned, stack_like(nnx.state(looped), nnx.state(scanned)))
  tokens, mask = _batch(seed=4)
  want = looped(tokens, attention_mask=mask)
  assert_close_f32(scanned(tokens, attention_mask=mask), want, ulps=256)   # scan vs loop
  assert_close_f32(merge_lora(scanned)(tokens, attention_mask=mask), want, ulps=256)
  cfg = tiny_config()
  save_peft_adapter(scanned, cfg, str(tmp_path / "scanned"))
  save_peft_adapter(looped, cfg, str(tmp_path / "looped"))
  assert ((tmp_path / "scanned" / "adapter_model.safetensors").read_bytes()
          == (tmp_path / "looped" / "adapter_model.safetensors").read_bytes())
  again = load_peft_adapter(Decoder(tiny_config(), rngs=nnx.Rngs(2)), str(tmp_path / "looped"))
  for key, adapter in adapters(again).items():
    np.testing.assert_array_equal(adapter.b[...], adapters(scanned)[key].b[...])


def test_zero_b_gives_the_base_model_at_every_entry_point():
  base, model = _lora_model()
  tokens, mask = _batch()
  np.testing.assert_array_equal(model(tokens, attention_mask=mask), base(tokens, attention_mask=mask))
  cache = model.init_cache(3, 12)
  kw = dict(positions=jnp.maximum(jnp.cumsum(mask, 1) - 1, 0), cache=cache, start=0,
            kv_mask=jnp.pad(mask, ((0, 0), (0, 3))))
  for fused in (None, "fused"):
    got, _ = model.forward_cached(tokens, **kw, fused=model.fused_weights() if fused else None)
    want, _ = base.forward_cached(tokens, **kw, fused=base.fused_weights() if fused else None)
    assert_close_f32(got, want, ulps=256)   # the LoRA program adds x·A·B (= 0) to the base's


def test_merged_decode_weights_equal_the_unmerged_forward():
  """The sampler's fused weights merge A·B once; the training forward keeps them apart."""
  _, model = _lora_model(seed=3)
  _randomise_b(model)
  tokens, mask = _batch(seed=1)
  full = model(tokens, attention_mask=mask)
  kw = dict(positions=jnp.maximum(jnp.cumsum(mask, 1) - 1, 0), cache=model.init_cache(3, 9),
            start=0, kv_mask=mask)
  fused, _ = model.forward_cached(tokens, **kw, fused=model.fused_weights())
  unfused, _ = model.forward_cached(tokens, **kw)
  real = np.asarray(mask) > 0
  # merged vs separate A·B, cached vs full: other matmul and attention sums
  assert_close_f32(np.asarray(fused)[real], np.asarray(full)[real], ulps=256)
  assert_close_f32(np.asarray(unfused)[real], np.asarray(full)[real], ulps=256)
  assert float(jnp.max(jnp.abs(full - _lora_model(seed=3)[0](tokens, attention_mask=mask)))) > 1e-2
  # and a plain decoder with W + (α/r)AB gives the same logits
  assert_close_f32(merge_lora(model)(tokens, attention_mask=mask), full, ulps=256)


def test_greedy_samples_are_the_same_tokens_merged_or_not():
  from rljax.sampling import SamplingParams, generate

  _, model = _lora_model(seed=5)
  _randomise_b(model, seed=2)
  tokens, mask = _batch(seed=2)
  params = SamplingParams(max_new_tokens=6, greedy=True)
  out = generate(model, tokens, mask, sampling=params, rng=jax.random.key(0))
  out_merged = generate(merge_lora(model), tokens, mask, sampling=params, rng=jax.random.key(0))
  np.testing.assert_array_equal(out.tokens, out_merged.tokens)
  assert_close_f32(out.logp, out_merged.logp, ulps=256)   # merged weights: other sums


def test_adapters_off_is_the_base_model():
  base, model = _lora_model(seed=7)
  _randomise_b(model)
  graphdef, lora, rest = nnx.split(model, nnx.LoRAParam, ...)
  reference = nnx.merge(graphdef, adapters_off(lora), rest)
  tokens, mask = _batch()
  np.testing.assert_array_equal(reference(tokens, attention_mask=mask),
                                base(tokens, attention_mask=mask))


def test_bf16_base_keeps_fp32_adapters():
  _, model = _lora_model(dtype="bfloat16", param_dtype="bfloat16")
  layer = model.layer_list()[0]
  assert layer.attn.q[...].dtype == jnp.bfloat16
  assert layer.attn.q_lora.a[...].dtype == jnp.float32
  tokens, mask = _batch()
  graphdef, state = nnx.split(model)     # (XLA CPU runs bf16 dots with f32 output under jit)
  logits = jax.jit(lambda s, t, m: nnx.merge(graphdef, s)(t, attention_mask=m))(state, tokens, mask)
  assert np.isfinite(np.asarray(logits)).all()


def _hf_base(tmp_path):
  config = transformers.Qwen2Config(
      vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
      tie_word_embeddings=False)
  torch.manual_seed(0)
  hf = transformers.Qwen2ForCausalLM(config).eval()
  with torch.no_grad():
    for p in hf.parameters():
      p.add_(0.05 * torch.randn_like(p))
  hf.save_pretrained(tmp_path / "base", safe_serialization=True)
  return tmp_path / "base"


def _torch_logits(hf, tokens, mask):
  positions = np.maximum(np.cumsum(mask, 1) - 1, 0)
  with torch.no_grad():
    return hf(input_ids=torch.tensor(np.asarray(tokens), dtype=torch.long),
              attention_mask=torch.tensor(np.asarray(mask), dtype=torch.long),
              position_ids=torch.tensor(positions, dtype=torch.long)).logits.numpy()


@pytest.mark.parametrize("targets", [("q", "k", "v", "o", "gate", "up", "down"), ("q", "v")])
def test_peft_loads_the_adapter_with_equal_logits(tmp_path, targets):
  import peft

  base_dir = _hf_base(tmp_path)
  model, cfg = load_hf(str(base_dir))
  add_lora(model, rank=3, alpha=6.0, targets=targets, rngs=nnx.Rngs(1))
  _randomise_b(model, seed=4)
  save_peft_adapter(model, cfg, str(tmp_path / "adapter"))
  hf = transformers.AutoModelForCausalLM.from_pretrained(base_dir)
  peft_model = peft.PeftModel.from_pretrained(hf, tmp_path / "adapter").eval()
  tokens, mask = _batch()
  real = np.asarray(mask) > 0
  want = _torch_logits(peft_model, tokens, mask)
  got = np.asarray(model(tokens, attention_mask=mask))
  assert_close_f32(got[real], want[real], ulps=256)   # JAX vs torch: other sums
  # the adapter matters: the logits moved away from the base's
  fresh_base = transformers.AutoModelForCausalLM.from_pretrained(base_dir).eval()
  assert np.max(np.abs(want - _torch_logits(fresh_base, tokens, mask))) > 1e-2
  # and reads back into a fresh base
  again, _ = load_hf(str(base_dir))
  load_peft_adapter(again, str(tmp_path / "adapter"))
  np.testing.assert_allclose(np.asarray(again(tokens, attention_mask=mask)), got, atol=1e-6)


def test_merged_hf_export_loads_in_transformers(tmp_path):
  base_dir = _hf_base(tmp_path)
  model, cfg = load_hf(str(base_dir))
  add_lora(model, rank=2, alpha=4.0, rngs=nnx.Rngs(2))
  _randomise_b(model, seed=5)
  save_hf(model, cfg, str(tmp_path / "merged"))
  hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
  tokens, mask = _batch()
  real = np.asarray(mask) > 0
  assert_close_f32(_torch_logits(hf, tokens, mask)[real],
                   np.asarray(model(tokens, attention_mask=mask))[real], ulps=256)   # as above
