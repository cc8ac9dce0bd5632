"""The `Rollout` record returned by `rljax.sampling.generate`."""

from __future__ import annotations

from typing import NamedTuple

import jax


class Rollout(NamedTuple):
  """Completions of a prompt batch, n per prompt, rows grouped prompt-major.

  Row r = i * n + j is completion j of prompt i. T = `SamplingParams.max_new_tokens`
  (fixed shape even when every row stopped early), P = the caller's prompt width.

  Attributes:
    tokens: completion tokens, int32 [B*n, T]; the pad id after the stop token.
    mask: int32 [B*n, T]; 1 up to and including the stop token, 0 after.
    logp: float32 [B*n, T]; log-prob of each chosen token under the distribution it was
      sampled from (temperature, then top-k / top-p / min-p truncation, renormalised;
      0 for greedy decoding); 0 where mask is 0.
    logp_full: float32 [B*n, T]; log-prob under the temperature-scaled, untruncated
      distribution log softmax(z / τ); 0 where mask is 0.
    truncated: bool [B*n]; True when the row hit `max_new_tokens` without a stop token.
    group_id: int32 [B*n]; index of the prompt the row was generated from.
    prompt_tokens: int32 [B*n, P], left-padded, repeated n times.
    prompt_mask: int32 [B*n, P], 1 on real prompt tokens.
    routes: MoE policies only (None for a dense model): the experts every MoE layer used
      for each token the sampler fed, [B*n, P + T, L_moe, k] in the compact dtype of
      `rljax.models.moe.route_dtype(E)`: the prompt's columns, then the completion's (the
      full sequence the trainer scores); `rljax.models.moe.no_route(dtype)` where no token
      was fed (the last token, tokens after a stop). `replay_ids_of` turns it into the
      decoder's `replay_ids`.
  """

  tokens: jax.Array
  mask: jax.Array
  logp: jax.Array
  logp_full: jax.Array
  truncated: jax.Array
  group_id: jax.Array
  prompt_tokens: jax.Array
  prompt_mask: jax.Array
  routes: jax.Array | None = None

  @property
  def lengths(self) -> jax.Array:
    """Completion lengths, int32 [B*n] (stop token included)."""
    return self.mask.sum(axis=-1)
