"""CharTokenizer / HFTokenizer / check_vocab / left_pad."""

import numpy as np
import pytest

from rljax.data import CharTokenizer, HFTokenizer, bucket_length, check_vocab, left_pad


def test_char_special_ids_and_tags_are_single_tokens():
  tok = CharTokenizer()
  assert (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 1, 2)
  ids = tok.encode("<answer>85</answer>")
  assert len(ids) == 4
  assert ids[0] == tok.token_to_id("<answer>") and ids[-1] == tok.token_to_id("</answer>")
  assert ids[1:3] == [tok.token_to_id("8"), tok.token_to_id("5")]
  assert max(tok.encode(tok.alphabet)) == tok.vocab_size - 1


def test_char_round_trip_and_decode_stops_at_eos():
  tok = CharTokenizer()
  text = "Q:23+45-17\n23+45=68\n68-17=51\n<answer>51</answer>"
  ids = tok.encode(text)
  assert tok.decode(ids) == text
  assert tok.decode([tok.bos_id] + ids + [tok.eos_id, 5, 6]) == text
  tail = tok.decode(ids + [tok.eos_id] + tok.encode("9"), stop_at_eos=False)
  assert tail == text + "9"
  assert tok.decode(np.array(ids + [tok.pad_id] * 3)) == text


def test_char_unknown_character_is_named():
  tok = CharTokenizer()
  with pytest.raises(ValueError, match=r"'元'.*position 1"):
    tok.encode("9元")
  with pytest.raises(ValueError, match="'<'"):  # a tag prefix is not a character
    tok.encode("<answ")
  with pytest.raises(ValueError, match="outside"):
    tok.decode([tok.vocab_size])


def test_char_save_load_round_trip(tmp_path):
  tok = CharTokenizer(alphabet="0123456789+=\n", tags=("<answer>", "</answer>"))
  tok.save(str(tmp_path))
  back = CharTokenizer.load(str(tmp_path))
  assert back == tok and back.vocab_size == 3 + 2 + 13
  assert back.encode("1+2=3\n") == tok.encode("1+2=3\n")
  (tmp_path / "bad.json").write_text('{"format": "other"}')
  with pytest.raises(ValueError, match="not a rljax.CharTokenizer"):
    CharTokenizer.load(str(tmp_path / "bad.json"))


def test_check_vocab():
  tok = CharTokenizer()
  check_vocab(tok, tok.vocab_size, strict=True)
  check_vocab(tok, 128)  # padded embedding is fine unless strict
  with pytest.raises(ValueError, match=f"{tok.vocab_size} > model vocab_size 64"):
    check_vocab(tok, 64)
  with pytest.raises(ValueError, match="strict"):
    check_vocab(tok, 128, strict=True)


def _tiny_hf_dir(tmp_path):
  from tokenizers import Tokenizer, models, pre_tokenizers
  from transformers import PreTrainedTokenizerFast

  vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "[UNK]": 3, "hello": 4, "world": 5, "!": 6}
  t = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
  t.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  fast = PreTrainedTokenizerFast(tokenizer_object=t, pad_token="<pad>", bos_token="<s>",
                                 eos_token="</s>", unk_token="[UNK]")
  fast.chat_template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n"
                        "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}")
  fast.save_pretrained(str(tmp_path))
  return str(tmp_path)


def test_hf_tokenizer_wrapper(tmp_path):
  tok = HFTokenizer(_tiny_hf_dir(tmp_path))
  assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.vocab_size) == (0, 1, 2, 7)
  assert tok.encode("hello world") == [4, 5]
  assert tok.decode([4, 5, 2, 6]) == "hello world"
  text = tok.apply_chat_template([{"role": "user", "content": "hi"}])
  assert text == "user: hi\nassistant:"
  check_vocab(tok, 7, strict=True)
  with pytest.raises(FileNotFoundError):
    HFTokenizer(str(tmp_path / "missing"))


def test_left_pad_golden():
  tokens, mask = left_pad([[5, 6, 7], [8]], pad_id=0, length=4)
  np.testing.assert_array_equal(tokens, [[0, 5, 6, 7], [0, 0, 0, 8]])
  np.testing.assert_array_equal(mask, [[0, 1, 1, 1], [0, 0, 0, 1]])
  assert tokens.dtype == np.int32 and mask.dtype == np.int32
  tokens, _ = left_pad([[1] * 17], pad_id=9)
  assert tokens.shape == (1, 32) and bucket_length(16) == 16
  with pytest.raises(ValueError, match="sequence 1 has 5 tokens > length 4"):
    left_pad([[1], [1] * 5], pad_id=0, length=4)
  with pytest.raises(ValueError, match="empty"):
    left_pad([], pad_id=0)
