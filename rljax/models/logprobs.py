"""Per-token log-probs and entropies of completion tokens, chunked over the sequence.

The lm head is applied only at the completion positions and in chunks of `chunk_size`
positions, so a [B,T,V] float32 log-softmax is never materialised (Qwen vocab: 151,936).
Each chunk is rematerialised in the backward pass, so the gradient does not store it
either.

Precision: logits are float32 (the lm-head matmul accumulates in float32) and the
log-softmax runs in float32 whatever the compute dtype. With bf16 compute
(`ModelConfig(dtype="bfloat16")`) the per-token log-probs differ from float32 compute by
max |Δ logp| ≈ 0.02 on the tiny random test models (vocab 97, width 64, 2 layers);
the documented tolerance, asserted in tests/test_models_logprobs.py, is 0.06. The gap
grows with depth and width: compare ratios computed at one precision only.

Peak memory (benchmarks/logprob_memory.py, B=4, T=1024, D=896, V=151,936, bf16
weights, chunk 64): forward 2,641 MB naive vs 430 MB chunked (6.2x), forward+backward
10,549 MB vs 1,890 MB (5.6x).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import chex
import jax
import jax.numpy as jnp

DEFAULT_CHUNK_SIZE = 128
# A chunk's float32 logits stay within this many bytes (a smaller chunk at large B·V): the
# chunk's logits and softmax are live together at the backward's start, beside every saved
# activation (Qwen2.5-0.5B, 8 rows: 128 -> 32 positions, 367 MB less peak in the update).
CHUNK_LOGITS_BYTES = 256 << 20


def chunk_positions(rows: int, positions: int, vocab: int, chunk_size: int) -> int:
  """Positions per lm-head chunk: at most `chunk_size` and T, and the largest power of two
  whose [rows, c, V] float32 logits fit `CHUNK_LOGITS_BYTES` (at least 1)."""
  fit = max(1, CHUNK_LOGITS_BYTES // (4 * rows * vocab))
  return max(1, min(chunk_size, positions, 1 << (fit.bit_length() - 1)))


def _chunk_stats(hidden_bcd, targets_bc, lm_head_fn, temperature, with_entropy):
  """log π(target) and a second statistic for one chunk; float32 [B,c] each.

  with_entropy: False (zeros), True (the entropy) or "sum_sq" (Σ_v π_v²).
  """
  z = lm_head_fn(hidden_bcd).astype(jnp.float32) / temperature  # [B,c,V]
  lse = jax.nn.logsumexp(z, axis=-1)  # [B,c]
  z_target = jnp.take_along_axis(z, targets_bc[..., None], axis=-1, mode="clip")[..., 0]
  logp = z_target - lse
  if not with_entropy:
    return logp, jnp.zeros_like(logp)
  probs = jnp.exp(z - lse[..., None])
  if with_entropy == "sum_sq":
    return logp, jnp.sum(jnp.square(probs), axis=-1)
  entropy = lse - jnp.sum(probs * z, axis=-1)
  return logp, entropy


def _chunked(hidden_btd, targets_bt, lm_head_fn, temperature, chunk_size, with_entropy):
  chex.assert_rank(hidden_btd, 3)
  chex.assert_rank(targets_bt, 2)
  chex.assert_equal_shape_prefix([hidden_btd, targets_bt], 2)
  b, t, d = hidden_btd.shape
  vocab = jax.eval_shape(lm_head_fn, hidden_btd[:, :1]).shape[-1]
  c = chunk_positions(b, t, vocab, chunk_size)
  n = -(-t // c)
  pad = n * c - t
  h = jnp.pad(hidden_btd, ((0, 0), (0, pad), (0, 0))).reshape(b, n, c, d).swapaxes(0, 1)
  y = jnp.pad(targets_bt, ((0, 0), (0, pad))).reshape(b, n, c).swapaxes(0, 1)
  fn = jax.checkpoint(functools.partial(
      _chunk_stats, lm_head_fn=lm_head_fn, temperature=temperature, with_entropy=with_entropy))
  logp, entropy = jax.lax.map(lambda xs: fn(*xs), (h, y))  # [n,B,c] each
  unchunk = lambda x: x.swapaxes(0, 1).reshape(b, n * c)[:, :t]
  return unchunk(logp), unchunk(entropy)


def logprobs_from_hidden(hidden_btd, targets_bt, lm_head_fn: Callable, *, temperature=1.0,
                         chunk_size: int = DEFAULT_CHUNK_SIZE):
  """log softmax(lm_head(h_t) / τ)[y_t], chunked over T.

  The sampling temperature τ must match the sampler's (huggingface/trl#4159: importance ratios
  far from 1 otherwise). Policy-gradient log-likelihood of Williams 1992 ("Simple
  statistical gradient-following algorithms for connectionist reinforcement learning",
  Eq. 3 ∇ log π), evaluated per token as in PPO (Schulman et al. 2017, arXiv:1707.06347,
  Eq. 6, r_t = π/π_old).

  Args:
    hidden_btd: hidden states that predict the targets, [B,T,D] (position t predicts y_t).
    targets_bt: int [B,T]; ids outside [0, V) (e.g. a -1 pad) are clipped, so padded
      positions stay finite (mask them downstream).
    lm_head_fn: [B,c,D] -> logits [B,c,V] (e.g. `model.logits_from_hidden`).
    temperature: τ > 0, scalar (may be traced).
    chunk_size: positions per lm-head chunk at most (`chunk_positions`); need not divide T.
  Returns:
    logp_bt, float32 [B,T].
  """
  return _chunked(hidden_btd, targets_bt, lm_head_fn, temperature, chunk_size, False)[0]


def logprobs_and_entropy_from_hidden(hidden_btd, targets_bt, lm_head_fn: Callable, *,
                                     temperature=1.0, chunk_size: int = DEFAULT_CHUNK_SIZE):
  """`logprobs_from_hidden` plus the entropy H_t = logsumexp(z) − Σ softmax(z)·z, z = logits/τ.

  Shannon entropy of the temperature-scaled policy at each position, computed in float32
  per chunk (verl `entropy_from_logits`; Cui et al. 2025, "The Entropy Mechanism of
  Reinforcement Learning for Reasoning Language Models", arXiv:2505.22617, Eq. 2).

  Returns:
    (logp_bt, entropy_bt), float32 [B,T] each.
  """
  return _chunked(hidden_btd, targets_bt, lm_head_fn, temperature, chunk_size, True)


def logprobs_and_sum_sq_from_hidden(hidden_btd, targets_bt, lm_head_fn: Callable, *,
                                    temperature=1.0, chunk_size: int = DEFAULT_CHUNK_SIZE):
  """`logprobs_from_hidden` plus Σ_v π_v² of the temperature-scaled next-token distribution.

  1 − 2π(y_t) + Σ_v π_v² = ‖∇_z log π(y_t)‖² is the squared norm of the log-prob's gradient
  with respect to the logits, the per-token variance proxy of the optimal token baseline
  (`rljax.ops.advantages_group.optimal_token_baseline_advantages`; verl
  `optimal_token_baseline`).

  Returns:
    (logp_bt, sum_sq_bt), float32 [B,T] each.
  """
  return _chunked(hidden_btd, targets_bt, lm_head_fn, temperature, chunk_size, "sum_sq")


def _completion_hidden(model, tokens_bs, positions_bs, attention_mask_bs, prompt_len):
  chex.assert_rank(tokens_bs, 2)
  s = tokens_bs.shape[1]
  if not 0 < prompt_len < s:
    raise ValueError(f"prompt_len={prompt_len} must be in (0, S={s})")
  hidden = model.hidden_states(tokens_bs, positions=positions_bs,
                               attention_mask=attention_mask_bs)  # [B,S,D]
  return hidden[:, prompt_len - 1:s - 1], tokens_bs[:, prompt_len:]


def token_logprobs(model, tokens_bs, positions_bs, attention_mask_bs, *, prompt_len: int,
                   temperature=1.0, chunk_size: int = DEFAULT_CHUNK_SIZE):
  """Log-probs of the completion tokens under `model` at temperature τ.

  Args:
    model: a `Decoder` (anything with `hidden_states` and `logits_from_hidden`).
    tokens_bs: int [B,S], S = P + T: left-padded prompt of static length P, then completion.
    positions_bs, attention_mask_bs: [B,S] as for `Decoder.__call__`.
    prompt_len: P (static int).
    temperature: τ, the sampler's temperature.
    chunk_size: completion positions per lm-head chunk.
  Returns:
    logp_bt, float32 [B,T]; logp_bt[:, t] = log π(tokens[:, P+t] | tokens[:, :P+t]).
  """
  h, y = _completion_hidden(model, tokens_bs, positions_bs, attention_mask_bs, prompt_len)
  return logprobs_from_hidden(h, y, model.logits_from_hidden, temperature=temperature,
                              chunk_size=chunk_size)


def token_logprobs_and_sum_sq(model, tokens_bs, positions_bs, attention_mask_bs, *,
                              prompt_len: int, temperature=1.0,
                              chunk_size: int = DEFAULT_CHUNK_SIZE):
  """`token_logprobs` plus Σ_v π_v² per token; returns (logp_bt, sum_sq_bt) float32 [B,T]."""
  h, y = _completion_hidden(model, tokens_bs, positions_bs, attention_mask_bs, prompt_len)
  return logprobs_and_sum_sq_from_hidden(h, y, model.logits_from_hidden,
                                         temperature=temperature, chunk_size=chunk_size)


def token_logprobs_and_entropy(model, tokens_bs, positions_bs, attention_mask_bs, *,
                               prompt_len: int, temperature=1.0,
                               chunk_size: int = DEFAULT_CHUNK_SIZE):
  """`token_logprobs` plus per-token entropies; returns (logp_bt, entropy_bt) float32 [B,T]."""
  h, y = _completion_hidden(model, tokens_bs, positions_bs, attention_mask_bs, prompt_len)
  return logprobs_and_entropy_from_hidden(h, y, model.logits_from_hidden,
                                          temperature=temperature, chunk_size=chunk_size)
