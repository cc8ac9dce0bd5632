"""Tokenizers: a tiny character-level tokenizer for the synthetic tasks, a thin wrapper
over Hugging Face tokenizers, and a vocabulary check.

Both tokenizers share one interface: `encode(text) -> list[int]`, `decode(ids) -> str`,
`vocab_size`, `pad_id`, `bos_id`, `eos_id`. `encode` never adds special tokens; the
caller prepends `bos_id` / appends `eos_id` where it wants them.
"""

from __future__ import annotations

import json
import os
import string
from collections.abc import Iterable, Sequence

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>")
DEFAULT_TAGS = ("<answer>", "</answer>", "<think>", "</think>")
DEFAULT_ALPHABET = (
  string.digits + "+-*/=()" + " \n" + ".,:;?!%^|_'\"" + string.ascii_uppercase + string.ascii_lowercase
)
_FORMAT = "rljax.CharTokenizer"


class CharTokenizer:
  """Character-level tokenizer with a fixed alphabet and a few multi-character tags.

  Ids: 0 = `<pad>`, 1 = `<bos>`, 2 = `<eos>`, then the tags (each one token, e.g.
  `<answer>`), then one id per alphabet character. Tags are matched greedily before
  single characters, and the tag characters `<`/`>` are not in the default alphabet, so
  every encodable string has exactly one encoding and `decode(encode(s)) == s`.

  Args:
    alphabet: the characters, in id order (no duplicates, no overlap with tags).
    tags: multi-character strings encoded as one token each.
  """

  def __init__(self, alphabet: str = DEFAULT_ALPHABET, tags: Sequence[str] = DEFAULT_TAGS):
    if len(set(alphabet)) != len(alphabet):
      raise ValueError("CharTokenizer: alphabet has duplicate characters")
    tags = tuple(tags)
    if any(len(t) < 2 for t in tags) or len(set(tags)) != len(tags):
      raise ValueError(f"CharTokenizer: tags must be distinct strings of >= 2 chars, got {tags}")
    self.alphabet = alphabet
    self.tags = tags
    self._itos = list(SPECIAL_TOKENS) + list(tags) + list(alphabet)
    self._stoi = {s: i for i, s in enumerate(self._itos)}
    # Longest tags first so that a tag that prefixes another never wins.
    self._tags_by_len = sorted(tags, key=len, reverse=True)
    self._tag_starts = {t[0] for t in tags}

  pad_id = 0
  bos_id = 1
  eos_id = 2

  @property
  def vocab_size(self) -> int:
    return len(self._itos)

  def token_to_id(self, token: str) -> int:
    """Id of one token (a special, a tag or a character); KeyError names it if unknown."""
    if token not in self._stoi:
      raise KeyError(f"CharTokenizer: unknown token {token!r}")
    return self._stoi[token]

  def encode(self, text: str) -> list[int]:
    """Encodes `text` (no bos/eos added).

    Raises:
      ValueError: naming the first character (and its position) not in the alphabet.
    """
    ids, i = [], 0
    while i < len(text):
      ch = text[i]
      if ch in self._tag_starts:
        tag = next((t for t in self._tags_by_len if text.startswith(t, i)), None)
        if tag is not None:
          ids.append(self._stoi[tag])
          i += len(tag)
          continue
      tid = self._stoi.get(ch)
      if tid is None or tid < len(SPECIAL_TOKENS):
        raise ValueError(
          f"CharTokenizer: unknown character {ch!r} (U+{ord(ch):04X}) at position {i} of "
          f"{text!r}; the alphabet is {self.alphabet!r} plus tags {list(self.tags)}")
      ids.append(tid)
      i += 1
    return ids

  def decode(self, ids: Iterable[int], *, stop_at_eos: bool = True,
             skip_special: bool = True) -> str:
    """Decodes ids to text.

    Args:
      ids: token ids (any int iterable, e.g. a NumPy row).
      stop_at_eos: stop at the first `<eos>` (it is not included).
      skip_special: drop `<pad>`/`<bos>`/`<eos>`; otherwise they are written out.
    Raises:
      ValueError: on an id outside [0, vocab_size).
    """
    out = []
    for raw in ids:
      i = int(raw)
      if i == self.eos_id and stop_at_eos:
        break
      if not 0 <= i < self.vocab_size:
        raise ValueError(f"CharTokenizer: id {i} outside [0, {self.vocab_size})")
      if i < len(SPECIAL_TOKENS) and skip_special:
        continue
      out.append(self._itos[i])
    return "".join(out)

  def to_dict(self) -> dict:
    return {"format": _FORMAT, "version": 1, "specials": list(SPECIAL_TOKENS),
            "tags": list(self.tags), "alphabet": self.alphabet}

  def save(self, path: str) -> None:
    """Writes a small JSON file (a path ending in `.json`, or a directory)."""
    if os.path.isdir(path):
      path = os.path.join(path, "char_tokenizer.json")
    with open(path, "w", encoding="utf-8") as f:
      json.dump(self.to_dict(), f, ensure_ascii=False, indent=1)

  @classmethod
  def load(cls, path: str) -> CharTokenizer:
    """Loads what `save` wrote; checks the format and the special tokens."""
    if os.path.isdir(path):
      path = os.path.join(path, "char_tokenizer.json")
    with open(path, encoding="utf-8") as f:
      d = json.load(f)
    if d.get("format") != _FORMAT:
      raise ValueError(f"{path}: not a {_FORMAT} file (format={d.get('format')!r})")
    if tuple(d["specials"]) != SPECIAL_TOKENS:
      raise ValueError(f"{path}: special tokens {d['specials']} != {list(SPECIAL_TOKENS)}")
    return cls(alphabet=d["alphabet"], tags=d["tags"])

  def __eq__(self, other) -> bool:
    return isinstance(other, CharTokenizer) and self._itos == other._itos

  def __repr__(self) -> str:
    return f"CharTokenizer(vocab_size={self.vocab_size}, tags={list(self.tags)})"


class HFTokenizer:
  """Thin wrapper over a local Hugging Face tokenizer with the `CharTokenizer` interface.

  Args:
    path: a local directory holding `tokenizer.json` / `tokenizer_config.json`. Nothing
      is downloaded (`local_files_only=True`).
  Note:
    `pad_id` falls back to `eos_id` when the tokenizer defines no pad token (Llama,
    Qwen base models); `bos_id` may be None (Qwen has no BOS).
  """

  def __init__(self, path: str):
    from transformers import AutoTokenizer  # lazy: importing transformers is slow

    if not os.path.isdir(path):
      raise FileNotFoundError(f"HFTokenizer: {path!r} is not a local directory")
    self.path = path
    self.hf = AutoTokenizer.from_pretrained(path, local_files_only=True)
    self.eos_id = self.hf.eos_token_id
    self.bos_id = self.hf.bos_token_id
    self.pad_id = self.hf.pad_token_id if self.hf.pad_token_id is not None else self.eos_id
    if self.pad_id is None:
      raise ValueError(f"HFTokenizer: {path} defines neither a pad nor an eos token")

  @property
  def vocab_size(self) -> int:
    """Number of ids the tokenizer can emit (base vocabulary plus added tokens)."""
    return len(self.hf)

  def encode(self, text: str) -> list[int]:
    return list(self.hf.encode(text, add_special_tokens=False))

  def decode(self, ids: Iterable[int], *, stop_at_eos: bool = True,
             skip_special: bool = True) -> str:
    ids = [int(i) for i in ids]
    if stop_at_eos and self.eos_id is not None and self.eos_id in ids:
      ids = ids[:ids.index(self.eos_id)]
    return self.hf.decode(ids, skip_special_tokens=skip_special)

  def apply_chat_template(self, messages: list[dict], *, add_generation_prompt: bool = True,
                          **kwargs) -> str:
    """Renders chat `messages` ([{"role": ..., "content": ...}]) to the prompt string.

    Raises:
      ValueError: if the tokenizer has no chat template (base models).
    """
    if not getattr(self.hf, "chat_template", None):
      raise ValueError(f"HFTokenizer: {self.path} has no chat_template (a base model?); "
                       "format the prompt yourself")
    return self.hf.apply_chat_template(messages, tokenize=False,
                                       add_generation_prompt=add_generation_prompt, **kwargs)


def check_vocab(tokenizer, model_vocab_size: int, *, strict: bool = False) -> None:
  """Checks that every id the tokenizer can emit has a row in the model's embedding.

  Args:
    tokenizer: a `CharTokenizer` or `HFTokenizer`.
    model_vocab_size: rows of the model's embedding / lm head.
    strict: require equality (for a model built for this tokenizer); otherwise the model
      may be larger (HF checkpoints pad the embedding to a multiple of 64 or 128).
  Raises:
    ValueError: on a mismatch, with both sizes in the message.
  """
  tv = int(tokenizer.vocab_size)
  specials = {"pad_id": tokenizer.pad_id, "bos_id": tokenizer.bos_id, "eos_id": tokenizer.eos_id}
  bad = {k: v for k, v in specials.items() if v is not None and not 0 <= v < model_vocab_size}
  if bad:
    raise ValueError(f"check_vocab: special ids {bad} outside the model vocabulary "
                     f"[0, {model_vocab_size})")
  if tv > model_vocab_size:
    raise ValueError(f"check_vocab: tokenizer vocab_size {tv} > model vocab_size "
                     f"{model_vocab_size}: ids >= {model_vocab_size} have no embedding row")
  if strict and tv != model_vocab_size:
    raise ValueError(f"check_vocab: tokenizer vocab_size {tv} != model vocab_size "
                     f"{model_vocab_size} (strict)")
