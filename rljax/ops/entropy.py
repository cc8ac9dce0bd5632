"""Policy entropy from logits (stable, float32), chunked over the sequence, entropy bonus
and an adaptive entropy coefficient."""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp


def entropy_from_logits(logits):
  """Entropy of softmax(z): H = logsumexp(z) − Σ_v softmax(z)_v·z_v, computed in float32.

  Shannon entropy H = −Σ p log p rewritten with log p = z − logsumexp(z), which needs no
  log of a (possibly underflowed) probability (verl `entropy_from_logits` in
  `verl/utils/torch_functional.py`). Logits must already be divided by the sampling
  temperature (huggingface/trl#4159 shows the ratios that result otherwise).

  Note: z is shifted by its (stop-gradient) max first, which leaves H and its gradient
  unchanged but avoids cancelling two large numbers when logits are large; −inf logits
  (filtered vocabulary) contribute 0.

  Args:
    logits: float [..., V] (any float dtype; upcast to float32 inside).
  Returns:
    entropy in nats, float32 [...].
  """
  z = logits.astype(jnp.float32)
  z = z - jax.lax.stop_gradient(jnp.max(z, axis=-1, keepdims=True))  # no cancellation
  lse = jax.nn.logsumexp(z, axis=-1)
  p = jax.nn.softmax(z, axis=-1)
  return lse - jnp.sum(jnp.where(p > 0, p * z, 0.0), axis=-1)


def chunked_entropy(inputs_bt, logits_fn, *, chunk_size):
  """Per-token entropy of `logits_fn(inputs)` computed chunk by chunk over T with `lax.map`.

  Only a [B, chunk_size, V] float32 block exists at a time; each chunk is wrapped in
  `jax.checkpoint`, so the backward pass recomputes the block instead of storing
  [B, T, V] residuals. `logits_fn` maps a [B, C, ...] slice of `inputs_bt` to logits
  [B, C, V]: pass hidden states and the LM head (`model.logits_from_hidden`) to never
  build the full logits, or a (bf16) logits array with `logits_fn=lambda x: x` to avoid
  only the full float32 copy. T is zero-padded up to a multiple of `chunk_size`.

  Args:
    inputs_bt: array [B, T, ...] (hidden states [B, T, D] or logits [B, T, V]).
    logits_fn: function [B, C, ...] -> [B, C, V].
    chunk_size: C, tokens per chunk.
  Returns:
    entropy, float32 [B, T].
  """
  chex.assert_rank(inputs_bt, {3})
  b, t = inputs_bt.shape[:2]
  n_chunks = -(-t // chunk_size)
  pad = n_chunks * chunk_size - t
  x = jnp.pad(inputs_bt, [(0, 0), (0, pad)] + [(0, 0)] * (inputs_bt.ndim - 2))
  x = x.reshape(b, n_chunks, chunk_size, *x.shape[2:]).swapaxes(0, 1)  # [N, B, C, ...]

  @jax.checkpoint
  def one_chunk(x_bc):
    return entropy_from_logits(logits_fn(x_bc))  # [B, C]

  ent = jax.lax.map(one_chunk, x)  # [N, B, C]
  return ent.swapaxes(0, 1).reshape(b, n_chunks * chunk_size)[:, :t]


def entropy_bonus(entropy_bt, mask, *, coef):
  """Per-token entropy-bonus loss term −coef·H_t (add to the policy loss, then aggregate).

  Schulman et al. 2017, "Proximal Policy Optimization Algorithms", arXiv:1707.06347,
  Eq. 9 (the c₂·S[π] term; the loss is minimised, hence the minus sign).

  Args:
    entropy_bt: float [B, T] (keep its gradient: the bonus acts through it).
    mask: [B, T].
    coef: c₂ ≥ 0 (verl default 0).
  Returns:
    loss term, float32 [B, T], 0 at masked positions.
  """
  chex.assert_equal_shape((entropy_bt, mask))
  return jnp.where(mask > 0, -coef * entropy_bt.astype(jnp.float32), 0.0)


class AdaptiveEntropyCoef(NamedTuple):
  """Adaptive entropy coefficient as a pure state (TRL `entropy_coef`, huggingface/trl#6140).

  Once per optimiser step with the global mean entropy H: coef += delta if H ≤ target,
  else coef −= delta, clipped to [min_value, max_value]. `coefficient(H)` is the coef to
  use now: the bonus is applied only while H ≤ target (Skywork-OR1, He et al. 2025,
  arXiv:2505.22312, Sec. 3.2.5 adaptive entropy control).
  """

  value: jax.Array
  target: float = 0.2
  delta: float = 0.005
  min_value: float = 0.0
  max_value: float = 1.0

  def update(self, entropy):
    step = jnp.where(entropy <= self.target, self.delta, -self.delta)
    value = jnp.clip(self.value + step, self.min_value, self.max_value)
    return self._replace(value=value)

  def coefficient(self, entropy):
    return jnp.where(entropy <= self.target, self.value, 0.0)
