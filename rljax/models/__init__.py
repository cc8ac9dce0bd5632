"""Decoder-only transformers (Llama / Qwen2 / Qwen3) in Flax NNX, heads, HF weights in and out."""

from rljax.models.config import ModelConfig, RopeScaling
from rljax.models.decoder import Decoder, KVCache

__all__ = ["Decoder", "KVCache", "ModelConfig", "RopeScaling"]
