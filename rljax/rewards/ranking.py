"""Ranking losses of reward-model training: pairwise Bradley-Terry and the InstructGPT K-wise
loss over a prompt's ranked completions (trained by `rljax.train.reward_model`)."""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np


class BradleyTerryDiagnostics(NamedTuple):
  """accuracy_b: 1.0 where r_w > r_l (ties count 0), float32 [B]; margin_b: r_w - r_l [B]."""
  accuracy_b: jax.Array
  margin_b: jax.Array


def bradley_terry_loss(chosen_scores_b, rejected_scores_b, *, margin=None):
  """Pairwise Bradley-Terry loss, −log σ(r(x, y_w) − r(x, y_l) − m).

  Bradley & Terry 1952, "Rank analysis of incomplete block designs"; Ouyang et al. 2022,
  "Training language models to follow instructions with human feedback", arXiv:2203.02155,
  Eq. 1 (one pair); margin m as in Touvron et al. 2023, "Llama 2", arXiv:2307.09288, Eq. 2.

  Args:
    chosen_scores_b: r(x, y_w), float [B].
    rejected_scores_b: r(x, y_l), float [B].
    margin: None (Eq. 1), a scalar or float [B] (Llama 2's m(r), larger for clearer pairs).
  Returns:
    (per-pair loss float32 [B], `BradleyTerryDiagnostics`).
  Note: computed as −log_sigmoid(·) (never log(sigmoid(·))), finite for any score gap.
  """
  chex.assert_rank(chosen_scores_b, 1)
  chex.assert_equal_shape([chosen_scores_b, rejected_scores_b])
  diff = chosen_scores_b.astype(jnp.float32) - rejected_scores_b.astype(jnp.float32)
  shifted = diff if margin is None else diff - jnp.asarray(margin, jnp.float32)
  loss = -jax.nn.log_sigmoid(shifted)
  return loss, BradleyTerryDiagnostics((diff > 0).astype(jnp.float32), diff)


def kwise_pairs(k: int) -> tuple[np.ndarray, np.ndarray]:
  """All C(K, 2) slot pairs (first, second), first < second, as static int32 arrays [C].

  When the K completions are sorted best first (rank = slot), `first` is the winner and
  `second` the loser of every pair.
  """
  if k < 2:
    raise ValueError(f"kwise_pairs: need k >= 2, got {k}")
  first, second = np.triu_indices(k, 1)
  return first.astype(np.int32), second.astype(np.int32)


class KwiseDiagnostics(NamedTuple):
  """accuracy_b: fraction of the prompt's valid pairs ordered correctly, float32 [B];
  num_pairs_b: number of valid pairs, float32 [B] (0 for a prompt without any)."""
  accuracy_b: jax.Array
  num_pairs_b: jax.Array


def kwise_ranking_loss(scores_bk, ranks_bk, mask_bk):
  """InstructGPT K-wise ranking loss, one batch element per prompt.

  loss(x) = −1/C(K,2) · Σ_{(y_w, y_l)} log σ(r(x, y_w) − r(x, y_l)) over all pairs of the
  prompt's ranking (Ouyang et al. 2022, arXiv:2203.02155, Eq. 1).

  Args:
    scores_bk: r(x_b, y_bk), float [B,K].
    ranks_bk: int [B,K], 0 = best; equal ranks are a tie.
    mask_bk: [B,K], 1 = the completion exists (prompts may have fewer than K).
  Returns:
    (per-prompt loss float32 [B], `KwiseDiagnostics`).
  Note: C(K,2) is replaced by the number of valid pairs of the prompt (both completions
  present, ranks differ): ties and missing completions are dropped, not counted as 0.
  A prompt with no valid pair has loss 0 and num_pairs 0.
  """
  chex.assert_rank(scores_bk, 2)
  chex.assert_equal_shape([scores_bk, ranks_bk, mask_bk])
  first, second = kwise_pairs(scores_bk.shape[1])
  s = scores_bk.astype(jnp.float32)
  r = ranks_bk
  m = mask_bk > 0
  first_wins = r[:, first] < r[:, second]  # [B,C]
  valid = m[:, first] & m[:, second] & (r[:, first] != r[:, second])
  s_w = jnp.where(valid, jnp.where(first_wins, s[:, first], s[:, second]), 0.0)
  s_l = jnp.where(valid, jnp.where(first_wins, s[:, second], s[:, first]), 0.0)
  pair_loss, diag = bradley_terry_loss(s_w.reshape(-1), s_l.reshape(-1))  # masked: 0, no grad
  n = valid.sum(axis=1).astype(jnp.float32)
  denom = jnp.maximum(n, 1.0)
  loss_b = jnp.where(valid, pair_loss.reshape(valid.shape), 0.0).sum(axis=1) / denom
  acc_b = jnp.where(valid, diag.accuracy_b.reshape(valid.shape), 0.0).sum(axis=1) / denom
  return loss_b, KwiseDiagnostics(acc_b, n)
