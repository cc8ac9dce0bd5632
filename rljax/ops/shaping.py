"""Reward shaping on sequence scores: DAPO soft overlong punishment, length penalty,
missing-EOS and n-gram repetition penalties, running z-score normalisation, clipping,
and reward whitening (Zheng et al. 2023, "Secrets of RLHF in Large Language Models Part I:
PPO", arXiv:2307.04964; Ziegler et al. 2019, arXiv:1909.08593)."""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from rljax.ops.advantages import whiten
from rljax.ops.stats import masked_count, masked_mean, masked_var, safe_divide


def soft_overlong_penalty(lengths, *, max_len, cache_len):
  """DAPO soft overlong punishment R_length(y), counted in tokens.

  Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale",
  arXiv:2503.14476, Eq. 13:
    0                              if |y| ≤ L_max − L_cache,
    ((L_max − L_cache) − |y|)/L_cache  if L_max − L_cache < |y| ≤ L_max,
    −1                             if |y| > L_max.
  The paper's setting (L_max = 20480, L_cache = 4096): no penalty up to 16384 tokens,
  linear to −1 at 20480. Added to the task score.

  Args:
    lengths: completion lengths in tokens, int or float [B].
    max_len: L_max.
    cache_len: L_cache, 0 < L_cache ≤ L_max.
  Returns:
    penalty, float32 [B], in [−1, 0].
  """
  if not 0 < cache_len <= max_len:
    raise ValueError(f"need 0 < cache_len <= max_len, got {cache_len=}, {max_len=}")
  lengths = jnp.asarray(lengths, jnp.float32)
  start = float(max_len - cache_len)
  inside = (start - lengths) / float(cache_len)
  return jnp.where(lengths <= start, 0.0, jnp.where(lengths <= max_len, inside, -1.0))


def length_penalty(lengths_bg, correct_bg, *, coef=1.0, mask_bg=None):
  """Kimi k1.5 group length reward: λ = 0.5 − (len − min_len)/(max_len − min_len).

  Kimi Team 2025, "Kimi k1.5: Scaling Reinforcement Learning with LLMs", arXiv:2501.12599,
  Sec. 2.3.3 (length penalty): reward λ for a correct response and min(0, λ) for a wrong
  one; min/max lengths are over the group's samples. Multiplied by `coef` and added to
  the score. All lengths equal gives 0.

  Args:
    lengths_bg: completion lengths, [B, G].
    correct_bg: bool or {0, 1} [B, G].
    coef: weight of the length reward.
    mask_bg: optional [B, G] validity (invalid samples neither count for min/max nor get
      a reward).
  Returns:
    length reward, float32 [B, G], in [−0.5·coef, 0.5·coef]; 0 where invalid.
  """
  chex.assert_rank(lengths_bg, 2)
  chex.assert_equal_shape((lengths_bg, correct_bg))
  valid = jnp.ones(lengths_bg.shape, bool) if mask_bg is None else mask_bg > 0
  lengths_bg = jnp.asarray(lengths_bg, jnp.float32)
  lo = jnp.min(jnp.where(valid, lengths_bg, jnp.inf), axis=-1, keepdims=True)
  hi = jnp.max(jnp.where(valid, lengths_bg, -jnp.inf), axis=-1, keepdims=True)
  span = jnp.where(hi > lo, hi - lo, 0.0)
  lam = jnp.where(span > 0, 0.5 - safe_divide(lengths_bg - lo, span), 0.0)
  reward = jnp.where(correct_bg > 0, lam, jnp.minimum(lam, 0.0))
  return jnp.where(valid, coef * reward, 0.0)


def missing_eos_penalty(truncated_b, *, penalty):
  """−penalty for a completion that never emitted its stop token (cut at the budget).

  TRL's `missing_eos_penalty` (PPO / RLOO / Online DPO trainers: "Penalty applied to the
  score when the model fails to generate an EOS token"), there subtracted from the
  reward-model score. Unlike DAPO's soft overlong punishment it does not depend on how far
  past a buffer the length went: any truncated sample gets the same penalty.

  Args:
    truncated_b: bool or {0, 1} [B], 1 = no stop token within the budget.
    penalty: a float ≥ 0.
  Returns:
    float32 [B]: −penalty where truncated, 0 elsewhere.
  """
  chex.assert_rank(truncated_b, 1)
  return jnp.where(jnp.asarray(truncated_b) > 0, -jnp.float32(penalty), 0.0)


def _distinct_ngrams_row(tokens_t, valid_t, n):
  """(number of distinct valid n-grams, number of valid n-grams) of one row."""
  t = tokens_t.shape[0]
  count = t - n + 1
  grams = jnp.stack([tokens_t[i:i + count] for i in range(n)], axis=-1)   # [count, n]
  ok = jnp.stack([valid_t[i:i + count] for i in range(n)], axis=-1).all(axis=-1)
  # Sort valid n-grams first (key 0: invalid flag), lexicographically; a distinct n-gram
  # starts wherever a valid sorted n-gram differs from the one before it.
  keys = [grams[:, i] for i in reversed(range(n))] + [~ok]
  order = jnp.lexsort(keys)
  g, v = grams[order], ok[order]
  new = jnp.concatenate([jnp.ones((1,), bool), jnp.any(g[1:] != g[:-1], axis=-1)])
  return jnp.sum(new & v), jnp.sum(ok)


def ngram_repetition_penalty(tokens_bt, mask_bt, *, n=3, max_penalty=1.0):
  """−max_penalty · (1 − distinct n-grams / n-grams) of each completion's token ids.

  The n-gram repetition penalty of Open-R1 / TRL's reward recipes
  (`get_repetition_penalty_reward(ngram_size, max_penalty)`), after Yeo et al. 2025,
  "Demystifying Long Chain-of-Thought Reasoning in LLMs", arXiv:2502.03373, §4.2: a
  completion that loops repeats its n-grams, so its share of distinct n-grams falls.

  Note: counted on token ids, not on whitespace-split words as Open-R1 does; a sequence
  with fewer than n tokens gets 0.

  Args:
    tokens_bt: int [B, T].
    mask_bt: [B, T], 1 on completion tokens (a prefix of each row).
    n: n-gram size ≥ 1.
    max_penalty: the penalty of a completion that is one n-gram repeated, ≥ 0.
  Returns:
    float32 [B] in [−max_penalty, 0].
  """
  chex.assert_rank(tokens_bt, 2)
  chex.assert_equal_shape((tokens_bt, mask_bt))
  if n < 1:
    raise ValueError(f"ngram_repetition_penalty: n={n} must be >= 1")
  if tokens_bt.shape[1] < n:
    return jnp.zeros(tokens_bt.shape[:1], jnp.float32)
  distinct, total = jax.vmap(lambda t, m: _distinct_ngrams_row(t, m > 0, n))(tokens_bt, mask_bt)
  share_repeated = jnp.where(total > 0, 1.0 - distinct / jnp.maximum(total, 1), 0.0)
  return (-max_penalty * share_repeated).astype(jnp.float32)


class RunningMoments(NamedTuple):
  """Running mean and (biased) variance of a stream, as a pure pytree state.

  `update` merges a batch's moments with the running ones by the parallel (Chan et al.
  1979) form of Welford's algorithm, so the result equals the moments of everything seen
  so far, whatever the batch split. Use for the z-score reward normalisation of
  `normalize_rewards`.
  """

  mean: jax.Array
  var: jax.Array
  count: jax.Array

  @classmethod
  def create(cls):
    zero = jnp.zeros((), jnp.float32)
    return cls(mean=zero, var=zero, count=zero)

  @property
  def std(self):
    return jnp.sqrt(self.var)

  def update(self, x, mask, *, axis_name=None):
    """Returns the state after also seeing the valid entries of `x` (any shape).

    Args:
      x: new values.
      mask: same shape as x.
      axis_name: mapped axis whose devices all contribute (global moments), or None.
    Returns:
      the new RunningMoments.
    """
    chex.assert_equal_shape((x, mask))
    x = jnp.where(mask > 0, x, 0.0).astype(jnp.float32)
    n_b = masked_count(mask, axis_name=axis_name)
    mean_b = masked_mean(x, mask, axis_name=axis_name)
    var_b = masked_var(x, mask, axis_name=axis_name)
    total = self.count + n_b
    delta = mean_b - self.mean
    mean = self.mean + safe_divide(delta * n_b, total)
    var = safe_divide(self.var * self.count + var_b * n_b
                      + delta**2 * safe_divide(self.count * n_b, total), total)
    return RunningMoments(mean=mean, var=var, count=total)


def normalize_rewards(rewards, moments, *, shift_mean=True, eps=1e-8):
  """Z-score reward normalisation r ← (r − μ)/sqrt(σ² + ε) with running moments.

  The reward normalisation of Zheng et al. 2023, "Secrets of RLHF in Large Language
  Models Part I: PPO", arXiv:2307.04964 (PPO-max), with moments over every batch so far.

  Args:
    rewards: scores, any shape.
    moments: a RunningMoments (usually already updated with this batch).
    shift_mean: False adds μ back (scale only, as `whiten(rewards, shift_mean=False)`).
    eps: added to the variance.
  Returns:
    normalised rewards, float32, same shape.
  """
  rewards = jnp.asarray(rewards, jnp.float32)
  out = (rewards - moments.mean) * jax.lax.rsqrt(moments.var + eps)
  return out if shift_mean else out + moments.mean


def clip_rewards(rewards, *, clip):
  """Reward clipping r ← clip(r, −c, c) (PPO-max's reward clipping, arXiv:2307.04964).

  Args:
    rewards: any shape.
    clip: c > 0.
  Returns:
    clipped rewards, same shape.
  """
  return jnp.clip(rewards, -clip, clip)


def whiten_rewards(rewards, mask, *, axis_name=None):
  """`whiten(rewards, shift_mean=False)`: rescale to unit variance, keep the mean.

  The reward whitening of Ziegler et al. 2019, arXiv:1909.08593 (its code's `whiten`).

  Args:
    rewards: any shape.
    mask: same shape.
    axis_name: mapped axis for global moments, or None.
  Returns:
    whitened rewards, float32, 0 at masked positions.
  """
  return whiten(rewards, mask, shift_mean=False, axis_name=axis_name)
