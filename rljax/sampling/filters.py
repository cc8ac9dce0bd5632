"""Token filters of the sampler as pure functions of logits.

Every filter returns a boolean "keep" mask of the logits' shape; `filter_logits` chains
them in the order of `transformers` `generate` (top-k, then top-p on the top-k
renormalised distribution, then min-p) and sets dropped logits to -inf, so a softmax of
the result is the renormalised truncated distribution. Values such as `top_p` may be
traced scalars; whether a filter runs at all is decided at trace time (None / 0 = off).
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from rljax.sampling.streams import row_uniforms

NEG_INF = -jnp.inf


def scale_temperature(logits_bv: jax.Array, temperature) -> jax.Array:
  """Softmax temperature: q_i = exp(z_i / τ) / Σ_j exp(z_j / τ).

  Hinton et al. 2015, "Distilling the Knowledge in a Neural Network", arXiv:1503.02531,
  Eq. 1. Computed in float32.

  Args:
    logits_bv: logits z, [..., V].
    temperature: τ > 0, Python or traced scalar.
  Returns:
    z / τ, float32 [..., V].
  """
  return logits_bv.astype(jnp.float32) / jnp.asarray(temperature, jnp.float32)


def top_k_keep(logits_bv: jax.Array, *, k: int) -> jax.Array:
  """Top-k truncation: keep the k largest logits.

  Fan et al. 2018, "Hierarchical Neural Story Generation", arXiv:1805.04833 (top-k random
  sampling of the next word).

  Args:
    logits_bv: logits, [..., V].
    k: static int >= 1.
  Returns:
    keep mask, bool [..., V].

  Note: tokens tied with the k-th largest logit are all kept (as in `transformers`).
  """
  k = min(int(k), logits_bv.shape[-1])
  kth_b1 = jax.lax.top_k(logits_bv, k)[0][..., -1:]
  return logits_bv >= kth_b1


def top_p_keep(logits_bv: jax.Array, *, p) -> jax.Array:
  """Nucleus (top-p) truncation: the smallest set V(p) of most likely tokens with mass >= p.

  Holtzman et al. 2019, "The Curious Case of Neural Text Degeneration", arXiv:1904.09751,
  Eq. 2 (Σ_{x ∈ V(p)} P(x) >= p), renormalised as in Eq. 3. A token is kept iff the mass
  of the strictly more likely tokens is < p, so the argmax is always kept.

  Args:
    logits_bv: logits of the (possibly already truncated, -inf) distribution, [..., V].
    p: mass in (0, 1], Python or traced scalar.
  Returns:
    keep mask, bool [..., V].

  Note: implemented as a threshold on the logit of the last token of V(p), so tokens tied
    with it are kept as well; no scatter back to vocabulary order is needed.
  """
  logits_bv = logits_bv.astype(jnp.float32)
  sorted_bv = jnp.flip(jnp.sort(logits_bv, axis=-1), axis=-1)   # descending
  probs_bv = jax.nn.softmax(sorted_bv, axis=-1)
  mass_before_bv = jnp.cumsum(probs_bv, axis=-1) - probs_bv
  n_keep_b1 = jnp.sum(mass_before_bv < p, axis=-1, keepdims=True)
  n_keep_b1 = jnp.maximum(n_keep_b1, 1)
  threshold_b1 = jnp.take_along_axis(sorted_bv, n_keep_b1 - 1, axis=-1)
  return logits_bv >= threshold_b1


def min_p_keep(logits_bv: jax.Array, *, min_p) -> jax.Array:
  """Min-p truncation: keep tokens with p_i >= p_base · p_max.

  Nguyen et al. 2024, "Turning Up the Heat: Min-p Sampling for Creative and Coherent LLM
  Outputs", arXiv:2407.01082, Sec. 3 (scaled threshold p_scaled = p_base × p_max).
  Evaluated in log space: z_i - max_j z_j >= log p_base.

  Args:
    logits_bv: logits, [..., V].
    min_p: p_base in [0, 1], Python or traced scalar.
  Returns:
    keep mask, bool [..., V].

  Note: applied to the temperature-scaled distribution (temperature first, as in
    `transformers` and vLLM); the paper also discusses applying temperature afterwards.
  """
  logits_bv = logits_bv.astype(jnp.float32)
  gap_bv = logits_bv - jnp.max(logits_bv, axis=-1, keepdims=True)
  return gap_bv >= jnp.log(jnp.asarray(min_p, jnp.float32))


def filter_logits(logits_bv: jax.Array, *, top_k: int = 0, top_p=None,
                  min_p=None) -> jax.Array:
  """Applies top-k -> top-p -> min-p (each only if enabled) and masks dropped tokens.

  Args:
    logits_bv: temperature-scaled logits, [..., V].
    top_k: static int; 0 (or >= V) disables.
    top_p: None disables, else a mass in (0, 1] (may be traced).
    min_p: None disables, else p_base in [0, 1] (may be traced).
  Returns:
    logits with dropped tokens at -inf, float32 [..., V]; its softmax is the renormalised
    truncated distribution.
  """
  chex.assert_rank(logits_bv, {1, 2, 3})
  out_bv = logits_bv.astype(jnp.float32)
  if 0 < top_k < logits_bv.shape[-1]:
    out_bv = jnp.where(top_k_keep(out_bv, k=top_k), out_bv, NEG_INF)
  if top_p is not None:
    out_bv = jnp.where(top_p_keep(out_bv, p=top_p), out_bv, NEG_INF)
  if min_p is not None:
    out_bv = jnp.where(min_p_keep(out_bv, min_p=min_p), out_bv, NEG_INF)
  return out_bv


def truncated_log_softmax(logits_bv: jax.Array, *, temperature=1.0, top_k: int = 0,
                          top_p=None, min_p=None) -> jax.Array:
  """Log-probabilities of the distribution the sampler draws from (-inf on dropped tokens).

  log softmax(filter(z / τ)): temperature, truncation, renormalisation. A trainer can use
  it to replay the sampling mask when computing old/new log-probs.

  Args:
    logits_bv: raw logits, [..., V].
    temperature: τ > 0.
    top_k, top_p, min_p: as in `filter_logits`.
  Returns:
    log-probs, float32 [..., V].
  """
  scaled_bv = scale_temperature(logits_bv, temperature)
  return jax.nn.log_softmax(filter_logits(scaled_bv, top_k=top_k, top_p=top_p, min_p=min_p))


def fast_argmax(x_bv: jax.Array) -> jax.Array:
  """argmax over the last axis (first index on ties), as max + masked min.

  Same result as `jnp.argmax` for non-NaN input; XLA CPU runs two plain reductions much
  faster than the variadic (value, index) reduction of `argmax`.

  Args:
    x_bv: [..., V].
  Returns:
    int32 [...].
  """
  v = x_bv.shape[-1]
  top_b1 = jnp.max(x_bv, axis=-1, keepdims=True)
  iota_v = jnp.arange(v, dtype=jnp.int32)
  return jnp.min(jnp.where(x_bv == top_b1, iota_v, v), axis=-1).astype(jnp.int32)


# Above this many tokens a draw inverts the CDF blockwise (`inverse_cdf_draw`).
DRAW_BLOCK = 512


def inverse_cdf_draw(probs_bv: jax.Array, uniform_b: jax.Array) -> jax.Array:
  """One draw per row from unnormalised probabilities by inversion of the CDF.

  Inversion method (Devroye 1986, "Non-Uniform Random Variate Generation", Ch. II.2,
  Theorem 2.1): with F the cumulative mass and u ~ U(0, 1], the token is the first i with
  F_i >= u · F_V. One uniform per row and step, instead of the V Gumbel variates per row
  that Gumbel-max needs (at V = 512, batch 64 the threefry draws alone cost about as much
  as a decoder layer on CPU).

  Above `DRAW_BLOCK` tokens the search runs in two levels over blocks of that many tokens:
  the block sums' prefix sum finds the block, the block's own prefix sum the token in it
  (the same F, summed in another order). XLA CPU's prefix sum over a whole row is slow:
  at Qwen2.5's V = 151,936 and 8 rows, 2.35 ms a draw against 0.57 ms blockwise, about 4 %
  of a 0.5B decode step (benchmarks/README.md, "The token draw").

  Args:
    probs_bv: non-negative unnormalised probabilities, float32 [B, V]; zeros are never drawn.
    uniform_b: u in (0, 1], float32 [B].
  Returns:
    tokens int32 [B].
  Note: rounding in the prefix sum may let a token of probability exactly 0 sit in a gap
    of one ulp; such a draw (odds ~1e-7) is replaced by the row's most likely token (of
    its block, blockwise), so a truncated-away token is never returned.
  """
  chex.assert_rank(probs_bv, 2)
  if probs_bv.shape[-1] > DRAW_BLOCK:
    return _blockwise_inverse_cdf_draw(probs_bv, uniform_b)
  cdf_bv = jnp.cumsum(probs_bv, axis=-1)
  target_b1 = uniform_b[:, None] * cdf_bv[:, -1:]
  tokens_b = jnp.sum(cdf_bv < target_b1, axis=-1, dtype=jnp.int32)
  tokens_b = jnp.minimum(tokens_b, probs_bv.shape[-1] - 1)
  drawn_ok = jnp.take_along_axis(probs_bv, tokens_b[:, None], axis=-1)[:, 0] > 0
  return jnp.where(drawn_ok, tokens_b, fast_argmax(probs_bv))


def _blockwise_inverse_cdf_draw(probs_bv, uniform_b):
  """`inverse_cdf_draw` in two searches over blocks of `DRAW_BLOCK` tokens (zero-padded)."""
  rows, v = probs_bv.shape
  blocks_bnk = jnp.pad(probs_bv, ((0, 0), (0, -v % DRAW_BLOCK))).reshape(rows, -1, DRAW_BLOCK)
  block_cdf_bn = jnp.cumsum(jnp.sum(blocks_bnk, axis=-1), axis=-1)
  target_b = uniform_b * block_cdf_bn[:, -1]
  # the first block whose cumulative mass reaches the target has mass of its own
  block_b = jnp.sum(block_cdf_bn < target_b[:, None], axis=-1, dtype=jnp.int32)
  block_b = jnp.minimum(block_b, block_cdf_bn.shape[-1] - 1)
  before_b = jnp.take_along_axis(block_cdf_bn, jnp.maximum(block_b - 1, 0)[:, None], axis=-1)
  before_b = jnp.where(block_b > 0, before_b[:, 0], 0.0)
  probs_bk = jnp.take_along_axis(blocks_bnk, block_b[:, None, None], axis=1)[:, 0]
  inner_cdf_bk = jnp.cumsum(probs_bk, axis=-1)
  inner_b = jnp.sum(inner_cdf_bk < (target_b - before_b)[:, None], axis=-1, dtype=jnp.int32)
  inner_b = jnp.minimum(inner_b, DRAW_BLOCK - 1)
  drawn_ok = jnp.take_along_axis(probs_bk, inner_b[:, None], axis=-1)[:, 0] > 0
  return block_b * DRAW_BLOCK + jnp.where(drawn_ok, inner_b, fast_argmax(probs_bk))


def sample_tokens(logits_bv: jax.Array, key: jax.Array | None, *, temperature=1.0,
                  greedy: bool = False, top_k: int = 0, top_p=None, min_p=None,
                  uniform_b: jax.Array | None = None):
  """Draws one token per row and returns its log-probs under the sampled and full distributions.

  Samples the filtered, renormalised distribution softmax(filter(z / τ)) by inversion of
  its CDF (`inverse_cdf_draw`) with one uniform per row, `row_uniforms(key, B)`.

  Args:
    logits_bv: raw logits, [B, V].
    key: one PRNG key for the whole batch (e.g. `fold_in(rng, step)`); unused when
      `uniform_b` is given.
    temperature: τ > 0 (traced or Python scalar).
    greedy: static; argmax decoding. The sampled-from distribution is then a point mass,
      so `logp` is 0.
    top_k, top_p, min_p: static enable / values as in `filter_logits`.
    uniform_b: optional pre-drawn uniforms, float32 [B], equal to `row_uniforms(key, B)`.
  Returns:
    tokens_b int32 [B]; logp_b float32 [B] (log-prob under the truncated, renormalised
    distribution); logp_full_b float32 [B] (log-prob under softmax(z / τ), untruncated).
  """
  chex.assert_rank(logits_bv, 2)
  scaled_bv = scale_temperature(logits_bv, temperature)
  logp_full_bv = jax.nn.log_softmax(scaled_bv, axis=-1)
  chosen = lambda lp_bv, tok_b: jnp.take_along_axis(lp_bv, tok_b[:, None], axis=-1)[:, 0]
  if greedy:
    tokens_b = fast_argmax(logits_bv.astype(jnp.float32))
    logp_full_b = chosen(logp_full_bv, tokens_b)
    return tokens_b, jnp.zeros_like(logp_full_b), logp_full_b
  truncating = (0 < top_k < logits_bv.shape[-1]) or top_p is not None or min_p is not None
  filtered_bv = filter_logits(scaled_bv, top_k=top_k, top_p=top_p, min_p=min_p)
  if uniform_b is None:
    uniform_b = row_uniforms(key, logits_bv.shape[0])
  # exp(log-softmax) of the full distribution, zeroed where truncated: the filtered
  # distribution up to its normalising constant.
  probs_bv = jnp.where(filtered_bv > NEG_INF, jnp.exp(logp_full_bv), 0.0)
  tokens_b = inverse_cdf_draw(probs_bv, uniform_b)
  logp_full_b = chosen(logp_full_bv, tokens_b)
  if not truncating:
    return tokens_b, logp_full_b, logp_full_b
  return tokens_b, chosen(jax.nn.log_softmax(filtered_bv, axis=-1), tokens_b), logp_full_b
