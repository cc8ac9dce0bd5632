"""Rejection-sampling fine-tuning data: best of K completions per prompt by reward.

Llama 2 (Touvron et al. 2023, arXiv:2307.09288, Sec. 3.2.3):
sample K outputs per prompt, keep the highest-reward one, fine-tune on it; alternated with RL.
"""

from __future__ import annotations

import numpy as np


def best_of_k(scores_b, group_id_b, *, min_score: float | None = None) -> np.ndarray:
  """Index of the best completion of each group (first on ties), in group order.

  Args:
    scores_b: float [B] rewards.
    group_id_b: int [B], equal ids = completions of one prompt.
    min_score: drop a group whose best score is below this (e.g. 1.0 = only correct ones).
  Returns:
    int64 [G'] indices into the batch, one per kept group, ordered by first appearance.
  """
  s, g = np.asarray(scores_b, np.float64), np.asarray(group_id_b)
  if s.shape != g.shape or s.ndim != 1:
    raise ValueError(f"best_of_k: scores {s.shape} and group_id {g.shape} must be equal 1-D")
  out = []
  for gid in dict.fromkeys(g.tolist()):
    idx = np.flatnonzero(g == gid)
    best = idx[int(np.argmax(s[idx]))]
    if min_score is None or s[best] >= min_score:
      out.append(best)
  return np.asarray(out, np.int64)


def rejection_sft_pairs(prompts, completions, scores_b, group_id_b, *,
                        min_score: float | None = None) -> list[tuple[object, str]]:
  """(prompt, best completion) pairs for SFT; `prompts[i]` belongs to `completions[i]`."""
  return [(prompts[i], completions[i]) for i in best_of_k(scores_b, group_id_b,
                                                          min_score=min_score)]
