"""Returns over time: GAE and discounted returns, reverse recursions over the completion
tokens (one `lax.scan(reverse=True)` for the batch, masked tokens skipped).

Same conventions as `rljax.ops.advantages` (which re-exports `gae` and `discounted_returns`):
per-token arrays are `[B, T]` with a `mask` of the same shape, 0 at masked positions.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp


def _reverse_masked_scan(step, xs_bt, mask, n_carry):
  """Runs `step(carry, x_t) -> (carry, out_t)` backwards over T, skipping masked tokens.

  Masked positions are transparent: the carry passes through them unchanged and their
  output is 0, so the recursion runs over the real tokens as if masked ones were deleted.
  """
  m_tb = (mask > 0).T
  xs_tb = tuple(jnp.where(mask > 0, x, 0.0).astype(jnp.float32).T for x in xs_bt)
  # zeros_like (not zeros) so the carry is device-varying like the inputs inside shard_map
  init = tuple(jnp.zeros_like(xs_tb[0][0]) for _ in range(n_carry))

  def body(carry, inp):
    m_t, x_t = inp[0], inp[1:]
    new_carry, out_t = step(carry, x_t)
    carry = tuple(jnp.where(m_t, n, c) for n, c in zip(new_carry, carry))
    return carry, jnp.where(m_t, out_t, 0.0)

  _, out_tb = jax.lax.scan(body, init, (m_tb, *xs_tb), reverse=True)
  return out_tb.T


def gae(rewards, values, mask, *, gamma, lam):
  """Generalised Advantage Estimation, Â_t = Σ_l (γλ)^l δ_{t+l}, δ_t = r_t + γV_{t+1} − V_t.

  Schulman et al. 2016, "High-Dimensional Continuous Control Using Generalized Advantage
  Estimation", arXiv:1506.02438, Eq. 16; recursion Â_t = δ_t + γλÂ_{t+1} run with
  `lax.scan(reverse=True)`. With γ = λ = 1 this is the Monte Carlo return minus the value
  (λ = 1 is the usual RLHF choice: verl's default γ = λ = 1).

  Note: bootstrap convention. The value after the last real token is 0 (the episode ends at
  EOS; no bootstrap for truncated completions). Masked positions are skipped, not reset:
  V_{t+1} and Â_{t+1} are those of the next *real* token (verl's multi-turn convention), so
  rewards and values at masked positions never matter. For the usual [1…1, 0…0] mask this is
  the textbook recursion.

  Args:
    rewards: per-token rewards r_t, float [B, T] (e.g. score on the last token − β·KL).
    values: critic values V(s_t), float [B, T].
    mask: 1 for real completion tokens, [B, T].
    gamma: discount γ.
    lam: GAE λ.
  Returns:
    (advantages [B, T], returns [B, T]) in float32; returns = advantages + values; both 0
    at masked positions.
  """
  chex.assert_rank(rewards, 2)
  chex.assert_equal_shape((rewards, values, mask))

  def step(carry, x):
    next_value, next_adv = carry
    r_t, v_t = x
    adv = r_t + gamma * next_value - v_t + gamma * lam * next_adv
    return (v_t, adv), adv

  adv = _reverse_masked_scan(step, (rewards, values), mask, n_carry=2)
  values = jnp.where(mask > 0, values, 0.0).astype(jnp.float32)
  return adv, jnp.where(mask > 0, adv + values, 0.0)


def discounted_returns(rewards, mask, *, gamma):
  """Token returns G_t = r_t + γ·G_{t+1}, reset after EOS (0 beyond the last real token).

  Sutton & Barto 2018, "Reinforcement Learning: An Introduction", Eq. 3.9; the return
  used by REINFORCE++ (Hu 2025, arXiv:2501.03262).

  Args:
    rewards: float [B, T].
    mask: [B, T]; masked positions are skipped as in `gae`.
    gamma: discount γ.
  Returns:
    returns, float32 [B, T], 0 at masked positions.
  """
  chex.assert_rank(rewards, 2)
  chex.assert_equal_shape((rewards, mask))

  def step(carry, x):
    ret = x[0] + gamma * carry[0]
    return (ret,), ret

  return _reverse_masked_scan(step, (rewards,), mask, n_carry=1)
