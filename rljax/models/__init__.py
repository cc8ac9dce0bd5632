"""Decoder-only transformers (Llama / Qwen2 / Qwen3) in Flax NNX, heads, HF weights in and out."""

from rljax.models.config import ModelConfig, RopeScaling
from rljax.models.decoder import Decoder, KVCache, positions_from_mask
from rljax.models.heads import RewardModel, ScalarHead, ValueModel, last_token_index
from rljax.models.hf import (
    abstract_hf,
    config_from_hf,
    config_to_hf,
    load_hf,
    load_hf_reward,
    save_hf,
    save_hf_reward,
)
from rljax.models.logprobs import (
    logprobs_and_entropy_from_hidden,
    logprobs_from_hidden,
    token_logprobs,
    token_logprobs_and_entropy,
)
from rljax.models.lora import (
    LoRAAdapter,
    adapters_off,
    add_lora,
    has_lora,
    load_peft_adapter,
    merge_lora,
    save_peft_adapter,
)

__all__ = [
    "LoRAAdapter", "add_lora", "adapters_off", "has_lora", "load_peft_adapter", "merge_lora",
    "save_peft_adapter", "abstract_hf",
    "Decoder", "KVCache", "ModelConfig", "RewardModel", "RopeScaling", "ScalarHead",
    "ValueModel", "config_from_hf", "config_to_hf", "last_token_index", "load_hf",
    "load_hf_reward", "logprobs_and_entropy_from_hidden", "logprobs_from_hidden",
    "positions_from_mask", "save_hf",
    "save_hf_reward", "token_logprobs", "token_logprobs_and_entropy",
]
