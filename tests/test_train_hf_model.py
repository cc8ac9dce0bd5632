"""RL on a Hugging Face checkpoint directory: a byte-level BPE tokenizer with a chat template
and Qwen2 weights saved by `transformers`, loaded by rljax, trained, and exported back."""

import pytest
from tolerances import f32_atol
from train_micro import micro_config, read_records

from rljax.data import make_task
from rljax.data.tokenizers import HFTokenizer
from rljax.train.rollout import prompt_ids

CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                 "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                 "{% endif %}")


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
  import torch
  import transformers
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

  task = make_task("arithmetic", difficulty=(1, 3), seed=0, n_train=256)
  corpus = [p.text + task.demonstration(p) for p in task.train_prompts()]
  bpe = Tokenizer(models.BPE())
  bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  bpe.decoder = decoders.ByteLevel()
  bpe.train_from_iterator(corpus, trainers.BpeTrainer(
      vocab_size=300, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  tok = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>",
                                             pad_token="<|endoftext|>")
  tok.chat_template = CHAT_TEMPLATE
  path = tmp_path_factory.mktemp("hf") / "tiny-qwen2"
  tok.save_pretrained(path)
  torch.manual_seed(0)
  config = transformers.Qwen2Config(
      vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, tie_word_embeddings=False)
  transformers.Qwen2ForCausalLM(config).save_pretrained(path)
  return str(path)


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
