"""rljax.ops.turns.turn_advantages against a slow NumPy loop written from its equation."""

import jax.numpy as jnp
import numpy as np
import pytest

from rljax.ops.turns import turn_advantages


def _reference(turn_rewards, turn_mask, token_turn, final, mask, gamma, group, eps=1e-6):
  b, k = turn_rewards.shape
  returns = np.zeros((b, k))
  for i in range(b):
    turns = [j for j in range(k) if turn_mask[i, j]]
    r = [turn_rewards[i, j] for j in turns]
    r[-1] += final[i]                       # the verifier's part sits on the last turn
    for j in turns:                         # G_j = sum_{l >= j} gamma^(l - j) r_l
      returns[i, j] = sum(gamma ** (m - j) * r[m] for m in range(j, len(turns)))
  g0 = returns[:, 0].reshape(-1, group)
  mean = np.repeat(g0.mean(1), group)
  std = np.repeat(g0.std(1, ddof=1), group)
  out = np.zeros(mask.shape)
  for i in range(b):
    for t in range(mask.shape[1]):
      if mask[i, t]:
        out[i, t] = (returns[i, token_turn[i, t]] - mean[i]) / (std[i] + eps)
  return out


@pytest.mark.parametrize("gamma", [1.0, 0.9, 0.0])
def test_turn_advantages_match_the_equation(gamma):
  rng = np.random.default_rng(0)
  b, k, t, group = 8, 4, 12, 4
  turns = rng.integers(1, k + 1, size=b)
  turn_mask = (np.arange(k)[None] < turns[:, None]).astype(np.float32)
  turn_rewards = (rng.normal(size=(b, k)) * turn_mask).astype(np.float32)
  token_turn = np.zeros((b, t), np.int32)
  for i in range(b):   # each turn a run of columns, ending at a random place
    ends = np.sort(rng.choice(np.arange(1, t), turns[i] - 1, replace=False))
    token_turn[i] = np.searchsorted(ends, np.arange(t), side="right")
  mask = (rng.random((b, t)) < 0.7).astype(np.int32)
  final = rng.normal(size=b).astype(np.float32)
  got = turn_advantages(jnp.asarray(turn_rewards), jnp.asarray(turn_mask),
                        jnp.asarray(token_turn), jnp.asarray(final), jnp.asarray(mask),
                        gamma=gamma, group_size=group)
  want = _reference(turn_rewards, turn_mask, token_turn, final, mask, gamma, group)
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


def test_one_turn_episodes_are_grpo_on_the_score():
  """With one turn per episode the turn advantage is GRPO's (r - mean) / (std + eps)."""
  scores = np.array([1.0, 0.0, 0.5, 2.0], np.float32)
  mask = np.ones((4, 3), np.int32)
  got = turn_advantages(jnp.zeros((4, 1)), jnp.ones((4, 1)), jnp.zeros((4, 3), jnp.int32),
                        jnp.asarray(scores), jnp.asarray(mask), gamma=1.0, group_size=4)
  want = (scores - scores.mean()) / (scores.std(ddof=1) + 1e-6)
  np.testing.assert_allclose(np.asarray(got), np.repeat(want[:, None], 3, 1), rtol=1e-6)
