"""Decoder-only transformers (Llama / Qwen2 / Qwen3) in Flax NNX, heads, HF weights in and out."""

from rljax.models.config import ModelConfig, RopeScaling
from rljax.models.decoder import Decoder, KVCache
from rljax.models.hf import config_from_hf, config_to_hf, load_hf, save_hf

__all__ = [
    "Decoder", "KVCache", "ModelConfig", "RopeScaling", "config_from_hf", "config_to_hf",
    "load_hf", "save_hf",
]
