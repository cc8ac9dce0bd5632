"""The seam rule of chat models: which ids follow the model's end-of-turn token.

A chat model ends each turn with its end-of-turn token (`<|im_end|>` for ChatML/Qwen,
`<|eot_id|>` for Llama 3); the template then writes what separates that turn from the next
message (a newline for ChatML, nothing for Llama 3), the observation as a message of
its own role, and the next assistant header. All of that is the observation's: its ids
carry no loss. Re-rendering the whole history instead is the most reported bug of other frameworks
(templates are not append-only, a dropped "\\n" per seam: verl-project/verl#6501,
verl-project/verl#3720).

The rule here is derived once from the tokenizer's own template, by rendering a fixed
two-message conversation with and without one more message (the fixed-base delta SkyRL
and TRL use): the text between the assistant's end-of-turn token and the marker, and
after the marker, is the seam. A tool turn ends on a `sampling.turn_stop` string, so the seam starts with the
end-of-turn id the model did not sample. `tests/test_envs_chat.py` checks, for a ChatML and a
Llama-3 template, that prompt ids + sampled ids + seam ids over a whole multi-turn
history equal `apply_chat_template` of that history.
"""

from __future__ import annotations

_MARK = "\x00OBS\x00"


class ChatSeam:
  """Observation text -> ids for a tokenizer with a chat template.

  Args:
    tokenizer: `rljax.data.tokenizers.HFTokenizer` (its `hf` has a chat template).
    role: the role observations take ("tool", or "user" for templates without one).
  Raises:
    ValueError: a template whose assistant turn does not end with the EOS token, or that
      does not extend the conversation by appending.
  """

  def __init__(self, tokenizer, role: str = "tool"):
    self.tokenizer, self.role = tokenizer, role
    hf = tokenizer.hf
    conversation = [{"role": "user", "content": "U"}, {"role": "assistant", "content": "A"}]
    base = hf.apply_chat_template(conversation, tokenize=False)
    full = hf.apply_chat_template(conversation + [{"role": role, "content": _MARK}],
                                  tokenize=False, add_generation_prompt=True)
    eot = hf.decode([tokenizer.eos_id], skip_special_tokens=False)
    end = base.rfind("A" + eot)
    if end < 0:
      raise ValueError(f"chat template: the assistant turn does not end with the EOS token "
                       f"{eot!r}; set sampling.turn_stop to the model's end-of-turn string")
    end += len("A" + eot)
    if not full.startswith(base[:end]) or _MARK not in full[end:]:
      raise ValueError("chat template: adding a message does not append to the rendering; "
                       "the seam cannot be derived")
    self.before, self.after = full[end:].split(_MARK)

  def observation_ids(self, text: str, *, close_turn: bool = True) -> list[int]:
    """Ids of `text` as a message of `role` and the next assistant header.

    A tool turn stops on a `sampling.turn_stop` string, not on the end-of-turn token (that
    one ends the episode), so with `close_turn` the end-of-turn id comes first: the
    environment closes the assistant's message, and like the rest of the seam it carries
    no loss."""
    head = [self.tokenizer.eos_id] if close_turn else []
    return head + self.tokenizer.encode(self.before + text + self.after)
