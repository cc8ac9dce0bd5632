"""The update batch: one typed record of everything the update reads about a rollout.

`Preparer.prepare` builds it from a `RolloutBatch` in stages (policy outputs, shaping,
advantages, weights, distillation); each stage returns a new batch with its fields filled
in (`batch._replace(...)`), and nothing writes into a batch after it is built. Fields a
run does not have stay None (a NamedTuple is a pytree: None leaves pass through `jax.jit`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


class UpdateBatch(NamedTuple):
  """B rows (one sampled completion each), P prompt and T completion columns.

  Attributes:
    prompt_tokens, prompt_mask: int [B, P], left-padded prompts.
    tokens: int [B, T], the completions.
    completion_mask: [B, T], the completion's tokens (sampled and observation tokens).
    sampler_logp: float [B, T], the sampler's log-probs of the tokens.
    truncated: bool [B], rows that hit the token budget.
    prompt_lengths, lengths: host int [B], prompt and completion extents (packing layout).
    scores: float [B], the verifier's score, then shaped (`stages.Shaper`).
    valid: float [B], rows in their group's baseline (multi-turn: `algo.on_truncated_episode`).
    keep_loss: float [B], rows that carry loss.
    routes: a MoE policy's sampled experts [B, P + T, L_moe, k], or None.
    greedy_scores: float [B], the greedy completion's score (ReMax), or None.
    reward_components: float [B, K], GDPO's unweighted rewards, or None.
    old_logp, entropy: float [B, T], the old policy's log-probs and entropies.
    ref_logp: float [B, T], the reference's log-probs (the old policy's without one).
    old_values: float [B, T], the critic's values (zeros without a critic).
    sampled_logp, sum_sq: float [B, T], log-probs and Σπ² of the sampling policy (the
      optimal token baseline), or None.
    teacher_logp: float [B, T], the distillation teacher's log-probs, or None.
    distill_penalty: float [B, T], c·(log π_s − log π_t) in the reward, or None.
    advantages, returns: float [B, T].
    mask: [B, T], the loss mask (the completion's tokens of the rows that carry loss).
    token_weights, is_weights: float [B, T], per-token loss and correction weights.
    rng: uint32 [B, 2], key data of each row's key (Clip-Cov's draws).
  """

  prompt_tokens: Any
  prompt_mask: Any
  tokens: Any
  completion_mask: Any
  sampler_logp: Any
  truncated: Any
  prompt_lengths: np.ndarray
  lengths: np.ndarray
  scores: Any
  valid: Any
  keep_loss: Any
  routes: Any = None
  greedy_scores: Any = None
  reward_components: Any = None
  old_logp: Any = None
  entropy: Any = None
  ref_logp: Any = None
  old_values: Any = None
  sampled_logp: Any = None
  sum_sq: Any = None
  teacher_logp: Any = None
  distill_penalty: Any = None
  advantages: Any = None
  returns: Any = None
  mask: Any = None
  token_weights: Any = None
  is_weights: Any = None
  rng: Any = None

  def sequences(self) -> dict:
    """The forward passes' sequence arrays by name (`mask`: the completion's tokens)."""
    return {"prompt_tokens": self.prompt_tokens, "prompt_mask": self.prompt_mask,
            "tokens": self.tokens, "mask": self.completion_mask}

  def extents(self) -> dict:
    """The host lengths of the packing layout: `prompt_lengths` and `lengths` [B]."""
    return {"prompt_lengths": self.prompt_lengths, "lengths": self.lengths}

  def float_mask(self):
    """The completion's tokens as float32 [B, T]."""
    return self.completion_mask.astype(jnp.float32)

  def take(self, index) -> UpdateBatch:
    """Rows `index` (int [n]) of every field."""
    return jax.tree.map(lambda x: x[index], self)


def from_rollout(rollout, keep_loss, valid) -> UpdateBatch:
  """The update batch of a `RolloutBatch` whose sequence arrays are on the trainer's rows:
  its sequences, raw scores and row flags (`keep_loss`, `valid`: host float [B])."""
  return UpdateBatch(
      prompt_tokens=rollout.prompt_tokens, prompt_mask=rollout.prompt_mask,
      tokens=rollout.tokens, completion_mask=rollout.mask, sampler_logp=rollout.sampler_logp,
      truncated=jnp.asarray(rollout.truncated),
      prompt_lengths=np.asarray(rollout.prompt_lengths), lengths=np.asarray(rollout.extent),
      scores=jnp.asarray(rollout.scores), valid=jnp.asarray(valid), keep_loss=keep_loss,
      routes=rollout.routes,
      greedy_scores=(None if rollout.greedy_scores is None
                     else jnp.asarray(rollout.greedy_scores)))
