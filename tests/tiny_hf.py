"""A tiny random Qwen2 checkpoint with a byte-level BPE tokenizer trained on the arithmetic
task, saved by `transformers` as a local Hugging Face directory (tests build it; nothing is
downloaded)."""

import pathlib


def save_tiny_qwen2(path: pathlib.Path, *, chat_template: str | None = None) -> str:
  """Writes the tokenizer (eos <|im_end|>, pad <|endoftext|>) and a 1-layer width-32 Qwen2
  with random weights (torch seed 0) to `path`; returns it as a string."""
  import torch
  import transformers
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

  from rljax.data import make_task

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
  if chat_template:
    tok.chat_template = chat_template
  tok.save_pretrained(path)
  torch.manual_seed(0)
  config = transformers.Qwen2Config(
      vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, tie_word_embeddings=False)
  transformers.Qwen2ForCausalLM(config).save_pretrained(path)
  return str(path)
