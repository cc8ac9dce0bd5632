"""Turn-level credit assignment for multi-turn episodes (tool calls, retries).

An episode of K turns gets a reward r_k at the end of each turn (the environment's step
reward), plus the verifier's reward on its last turn. Every token of turn k is credited
with the discounted return from its turn, G_k = Σ_{j≥k} γ^{j−k} r_j, and baselined against
the group's episode returns G_0 (GRPO's normalisation over the n episodes of one prompt).
"""

from __future__ import annotations

import chex
import jax.numpy as jnp

from rljax.ops.advantages import discounted_returns


def turn_advantages(turn_rewards_bk, turn_mask_bk, token_turn_bt, final_reward_b, mask, *,
                    gamma, group_size, eps=1e-6):
  """Per-token advantages from per-turn rewards, baselined on the group's episode returns.

    r'_k = r_k + 1[k = last turn]·f          (f: the verifier's part of the score)
    G_k  = Σ_{j≥k} γ^{j−k} r'_j               (return from turn k)
    Â_t  = (G_{k(t)} − mean_g G_0) / (std_g G_0 + ε)   for token t of turn k(t)

  The return-to-go per turn is the multi-turn form of REINFORCE's return (Sutton & Barto
  2018, Eq. 3.9, with turns as steps); the baseline is GRPO's group normalisation (Shao et
  al. 2024, "DeepSeekMath", arXiv:2402.03300, Eq. 3) applied to whole-episode returns.

  Note: the baseline is the group's *episode* returns G_0 for every turn, not a
  per-turn-index baseline: when the policy decides how many turns an episode has, turn k
  of different episodes is not the same state, and a per-index mean is biased (the point
  made in verl-project/verl#7244). std is over the group with ddof = 1.

  Args:
    turn_rewards_bk: the environment's step reward of each turn, float [B, K].
    turn_mask_bk: 1 for the turns that exist (a prefix of each row), [B, K].
    token_turn_bt: the turn index of each completion column, int [B, T] in [0, K).
    final_reward_b: what is added to the last turn's reward (the score minus the
      environment's rewards), float [B].
    mask: 1 on the tokens the policy sampled, [B, T].
    gamma: discount γ per turn.
    group_size: G, consecutive rows that share a prompt (B a multiple of G, G >= 2).
    eps: ε of the normalisation.
  Returns:
    advantages, float32 [B, T], 0 where `mask` is 0.
  """
  chex.assert_rank((turn_rewards_bk, turn_mask_bk, token_turn_bt, final_reward_b, mask),
                   (2, 2, 2, 1, 2))
  chex.assert_equal_shape((turn_rewards_bk, turn_mask_bk))
  chex.assert_equal_shape((token_turn_bt, mask))
  valid = turn_mask_bk > 0
  k = turn_rewards_bk.shape[1]
  last = jnp.max(jnp.where(valid, jnp.arange(k)[None], -1), axis=1)
  rewards = jnp.where(valid, turn_rewards_bk.astype(jnp.float32), 0.0)
  rewards = rewards + jnp.where(jnp.arange(k)[None] == last[:, None],
                                final_reward_b.astype(jnp.float32)[:, None], 0.0)
  returns_bk = discounted_returns(rewards, valid, gamma=gamma)
  returns_bt = jnp.take_along_axis(returns_bk, jnp.clip(token_turn_bt, 0, k - 1), axis=1)
  episode_bg = returns_bk[:, 0].reshape(-1, group_size)
  mean = jnp.repeat(jnp.mean(episode_bg, axis=1), group_size)
  std = jnp.repeat(jnp.std(episode_bg, axis=1, ddof=1), group_size)
  adv = (returns_bt - mean[:, None]) / (std[:, None] + eps)
  return jnp.where(mask > 0, adv, 0.0)
