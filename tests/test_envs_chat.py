"""The chat seam: prompt ids + sampled ids + observation ids over a multi-turn history
equal `apply_chat_template` of that history, for a ChatML and a Llama-3 template."""

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from rljax.data.tokenizers import HFTokenizer
from rljax.envs.chat import ChatSeam

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
LLAMA3 = ("<|begin_of_text|>{% for m in messages %}<|start_header_id|>{{ m['role'] }}"
          "<|end_header_id|>\n\n{{ m['content'] }}<|eot_id|>{% endfor %}"
          "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n"
          "{% endif %}")
CASES = {
    "chatml": (CHATML, ["<|im_start|>", "<|im_end|>"], "<|im_end|>", None),
    "llama3": (LLAMA3, ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                        "<|eot_id|>"], "<|eot_id|>", "<|begin_of_text|>"),
}
CORPUS = ["compute 12 plus 30", "call calc(12+30)", "result 42", "the answer is 42",
          "tool output: 7 apples", "hello world"] * 20


def _tokenizer(tmp_path, case):
  template, specials, eos, bos = CASES[case]
  tok = Tokenizer(models.BPE(unk_token="[UNK]"))
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
      vocab_size=300, special_tokens=["[UNK]", *specials],
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  from tokenizers import decoders
  tok.decoder = decoders.ByteLevel()
  hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos, bos_token=bos,
                               unk_token="[UNK]")
  hf.chat_template = template
  hf.save_pretrained(tmp_path / case)
  return HFTokenizer(str(tmp_path / case))


def _ids(encoded):
  """apply_chat_template returns a list or, in newer transformers, a BatchEncoding."""
  return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)


@pytest.mark.parametrize("case", list(CASES))
def test_seam_ids_equal_the_templated_history(tmp_path, case):
  tok = _tokenizer(tmp_path, case)
  seam = ChatSeam(tok)
  user = "compute 12 plus 30"
  turns = [("call calc(12+30)", "result 42"), ("call calc(42+0)", "tool output: 7 apples"),
           ("the answer is 42", None)]
  # the trainer's row: prompt (template + assistant header), then per turn the sampled ids
  # (a tool turn stops on its turn_stop string; the last turn on the end-of-turn token) and
  # the observation ids (the end-of-turn token the model did not sample, then the seam)
  ids = tok.hf.apply_chat_template([{"role": "user", "content": user}], tokenize=True,
                                   add_generation_prompt=True)
  ids = _ids(ids)
  messages = [{"role": "user", "content": user}]
  for action, observation in turns:
    ids += tok.encode(action)
    messages.append({"role": "assistant", "content": action})
    if observation is None:
      ids.append(tok.eos_id)
    else:
      ids += seam.observation_ids(observation)
      messages.append({"role": "tool", "content": observation})
  want = tok.hf.apply_chat_template(messages, tokenize=True)
  want = _ids(want)
  if case == "chatml":   # ChatML's rendering ends the last assistant turn with "\n"
    want = want[:len(ids)]
  assert ids == want
  assert "assistant" in seam.after


def test_a_template_whose_assistant_turn_does_not_end_with_eos_is_refused(tmp_path):
  tok = _tokenizer(tmp_path, "chatml")
  tok.hf.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
  with pytest.raises(ValueError, match="turn_stop"):
    ChatSeam(tok)


def test_observation_truncation_counts_the_text_not_the_seam(tmp_path):
  from rljax.train.rollout.environments import observation_ids
  tok = _tokenizer(tmp_path, "chatml")
  seam = ChatSeam(tok)
  text = "tool output: 7 apples " * 5
  cut = observation_ids(tok, seam, text, max_tokens=3)
  kept = tok.decode(tok.encode(text)[:3], stop_at_eos=False, skip_special=False)
  assert cut == seam.observation_ids(kept)
  assert cut[0] == tok.eos_id and len(cut) > 3   # the seam is kept whole
  assert observation_ids(tok, None, text, max_tokens=3) == tok.encode(text)[:3]
