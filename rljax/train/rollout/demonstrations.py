"""Demonstration rows in the rollout layout, for the supervised warm start and the ptx term."""

from __future__ import annotations

import numpy as np

from rljax.data.batching import left_pad


def demonstration_batch(ctx, prompts, completion_len, *, worked=False):
  """Prompt + demonstration rows in the rollout layout (prompt left-padded, completion right).

  worked=True: the worked solution of every prompt (`Task.demonstration(worked=True)`).
  """
  tok = ctx.tokenizer
  p_ids = [ctx.prompt_ids(p) for p in prompts]
  prompt_tokens, prompt_mask = left_pad(p_ids, pad_id=tok.pad_id, length=ctx.prompt_len)
  tokens = np.full((len(prompts), completion_len), tok.pad_id, np.int32)
  mask = np.zeros((len(prompts), completion_len), np.int32)
  observation_re = getattr(ctx.task, "observation_re", None)
  for i, p in enumerate(prompts):
    demo = ctx.task.demonstration(p, worked=True) if worked else ctx.task.demonstration(p)
    ids, keep = demonstration_ids(tok, demo, observation_re)
    ids, keep = (ids + [tok.eos_id])[:completion_len], (keep + [1])[:completion_len]
    tokens[i, :len(ids)] = ids
    mask[i, :len(ids)] = keep
  return {"prompt_tokens": prompt_tokens, "prompt_mask": prompt_mask, "tokens": tokens,
          "mask": mask}


def demonstration_ids(tokenizer, text, observation_re=None):
  """(ids, loss mask) of a demonstration: spans matching `observation_re` (what an
  environment writes, e.g. a tool's `<result>...</result>`) are encoded separately, as the
  multi-turn rollout appends them, and carry no loss."""
  if observation_re is None:
    ids = tokenizer.encode(text)
    return ids, [1] * len(ids)
  ids, keep, pos = [], [], 0
  for match in observation_re.finditer(text):
    for piece, trained in ((text[pos:match.start()], 1), (match.group(0), 0)):
      piece_ids = tokenizer.encode(piece) if piece else []
      ids += piece_ids
      keep += [trained] * len(piece_ids)
    pos = match.end()
  tail = tokenizer.encode(text[pos:]) if text[pos:] else []
  return ids + tail, keep + [1] * len(tail)
