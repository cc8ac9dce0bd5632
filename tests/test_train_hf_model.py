"""RL on a Hugging Face checkpoint directory: a byte-level BPE tokenizer with a chat template
and Qwen2 weights saved by `transformers`, loaded by rljax, trained, and exported back."""

import pytest
from tiny_hf import save_tiny_qwen2
from tolerances import f32_atol
from train_micro import micro_config, read_records

from rljax.data.tokenizers import HFTokenizer
from rljax.train.rollout import prompt_ids

CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                 "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                 "{% endif %}")


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
  """A random 1-layer Qwen2 (transformers) and a byte-level BPE tokenizer trained on the task."""
  return save_tiny_qwen2(tmp_path_factory.mktemp("hf") / "tiny-qwen2", chat_template=CHAT_TEMPLATE)


def test_chat_template_wraps_prompts_without_a_bos(hf_dir):
  tok = HFTokenizer(hf_dir)
  assert tok.bos_id is None
  plain = prompt_ids(tok, "Q:1+2\n")
  chat = tok.decode(prompt_ids(tok, "Q:1+2\n", chat_template=True), stop_at_eos=False,
                    skip_special=False)
  assert tok.decode(plain) == "Q:1+2\n"
  assert chat.startswith("<|im_start|>user\nQ:1+2\n") and chat.endswith("<|im_start|>assistant\n")


def test_rl_on_a_hugging_face_checkpoint(hf_dir, tmp_path):
  config = micro_config("grpo", tmp_path, **{"model.hf_path": hf_dir, "task.chat_template": True,
                                             "sft.steps": 2, "run.iterations": 2})
  from rljax.train.loop import train

  result = train(config)
  assert result["iterations"] == 2
  records = read_records(tmp_path / "grpo")
  assert all(r["update/skipped"] == 0 for r in records)
  # The sampler and the trainer agree on every log-prob (same positions, same template), up
  # to the rounding of a cached vs a full forward: 256 eps32 of |logp| ≲ 10 (300 tokens).
  assert records[-1]["mismatch/logp_gap_max"] < f32_atol(10.0, ulps=256)
