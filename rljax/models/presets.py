"""Model shapes without weights: the architecture fields of published `config.json` files.

`model.hf_config` names one of these presets or a `config.json` path; either way only the
architecture is read (`rljax.models.config_from_hf`), no weights. The values are those of
each model's `config.json` on the Hugging Face Hub (`PRESET_SOURCES`), the base (not the
instruct) checkpoints; the instruct variants share the shapes (Qwen2.5's instruct configs
give 32,768 positions instead of 131,072).
"""

from __future__ import annotations

import json
import pathlib

_QWEN2 = dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", hidden_act="silu",
              rope_theta=1000000.0, bos_token_id=151643, eos_token_id=151643)
_QWEN3 = dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", hidden_act="silu",
              rope_theta=1000000.0, attention_bias=False, head_dim=128, rms_norm_eps=1e-6,
              vocab_size=151936, max_position_embeddings=40960, tie_word_embeddings=False,
              bos_token_id=151643, eos_token_id=151645)
_LLAMA31 = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_act="silu",
                attention_bias=False, mlp_bias=False, rms_norm_eps=1e-5, rope_theta=500000.0,
                rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                  high_freq_factor=4.0, original_max_position_embeddings=8192),
                vocab_size=128256, max_position_embeddings=131072, head_dim=128,
                tie_word_embeddings=False, bos_token_id=128000, eos_token_id=128001)


def _shape(base, hidden, intermediate, layers, heads, kv_heads, **rest):
  return dict(base, hidden_size=hidden, intermediate_size=intermediate,
              num_hidden_layers=layers, num_attention_heads=heads,
              num_key_value_heads=kv_heads, **rest)


SHAPE_PRESETS = {
    "qwen2.5-0.5b": _shape(_QWEN2, 896, 4864, 24, 14, 2, vocab_size=151936,
                           max_position_embeddings=32768, rms_norm_eps=1e-6,
                           tie_word_embeddings=True),
    "qwen2.5-1.5b": _shape(_QWEN2, 1536, 8960, 28, 12, 2, vocab_size=151936,
                           max_position_embeddings=131072, rms_norm_eps=1e-6,
                           tie_word_embeddings=True),
    "qwen2.5-7b": _shape(_QWEN2, 3584, 18944, 28, 28, 4, vocab_size=152064,
                         max_position_embeddings=131072, rms_norm_eps=1e-6,
                         tie_word_embeddings=False),
    "qwen2.5-32b": _shape(_QWEN2, 5120, 27648, 64, 40, 8, vocab_size=152064,
                          max_position_embeddings=131072, rms_norm_eps=1e-5,
                          tie_word_embeddings=False),
    "qwen3-8b": _shape(_QWEN3, 4096, 12288, 36, 32, 8),
    "qwen3-32b": _shape(_QWEN3, 5120, 25600, 64, 64, 8),
    "llama-3.1-8b": _shape(_LLAMA31, 4096, 14336, 32, 32, 8),
    "llama-3.1-70b": _shape(_LLAMA31, 8192, 28672, 80, 64, 8),
    # mixture of experts: every layer routes each token to 8 of 128 experts of width 768
    # (`intermediate_size` is the dense MLP width of layers in `mlp_only_layers`: none)
    "qwen3-30b-a3b": _shape(_QWEN3, 2048, 6144, 48, 32, 4, architectures=["Qwen3MoeForCausalLM"],
                            model_type="qwen3_moe", num_experts=128, num_experts_per_tok=8,
                            moe_intermediate_size=768, norm_topk_prob=True,
                            decoder_sparse_step=1, mlp_only_layers=[]),
}
_HUB_IDS = {"qwen2.5-0.5b": "Qwen/Qwen2.5-0.5B", "qwen2.5-1.5b": "Qwen/Qwen2.5-1.5B",
            "qwen2.5-7b": "Qwen/Qwen2.5-7B", "qwen2.5-32b": "Qwen/Qwen2.5-32B",
            "qwen3-8b": "Qwen/Qwen3-8B", "qwen3-32b": "Qwen/Qwen3-32B",
            "llama-3.1-8b": "meta-llama/Llama-3.1-8B", "llama-3.1-70b": "meta-llama/Llama-3.1-70B",
            "qwen3-30b-a3b": "Qwen/Qwen3-30B-A3B"}
PRESET_SOURCES = {name: f"https://huggingface.co/{hub}/blob/main/config.json"
                  for name, hub in _HUB_IDS.items()}


def preset_name(value: str) -> str | None:
  """The preset `value` names ("qwen2.5-7b", or its Hub id "Qwen/Qwen2.5-7B"), or None."""
  key = value.strip().lower()
  by_hub = {hub.lower(): name for name, hub in _HUB_IDS.items()}
  return key if key in SHAPE_PRESETS else by_hub.get(key)


def hf_config_dict(value: str) -> dict:
  """The `config.json` dict of a preset name, a `config.json` file, or a directory with one.

  Raises:
    ValueError: neither a preset nor a readable config.json (the message lists the presets).
  """
  name = preset_name(value)
  if name is not None:
    return dict(SHAPE_PRESETS[name])
  path = pathlib.Path(value)
  if path.is_dir():
    path = path / "config.json"
  try:
    return json.loads(path.read_text())
  except (OSError, ValueError) as err:
    raise ValueError(f"{value!r} is neither a shape preset ({sorted(SHAPE_PRESETS)}) nor a "
                     f"readable config.json ({type(err).__name__})") from err
