"""Token masks and sample weights: high-entropy forking tokens, PSR/NSR/W-REINFORCE
weights, overlong (truncated) filtering."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from rljax.ops.stats import masked_count

# (positive_weight, negative_weight) of Zhu et al. 2025 (arXiv:2506.01347), Sec. 3 / 5.
PSR_NSR_PRESETS = {
    "reinforce": (1.0, 1.0),
    "psr": (1.0, 0.0),
    "nsr": (0.0, 1.0),
    "w_reinforce": (0.1, 1.0),
}


def high_entropy_mask(entropy_bt, mask, *, top_fraction=0.2, axis_name=None):
  """Keeps the top-ρ fraction of valid tokens by entropy ("forking tokens").

  Wang et al. 2025, "Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive Effective
  Reinforcement Learning for LLM Reasoning", arXiv:2506.01939, Sec. 5 (masked DAPO
  objective with the indicator 𝟙[H_t ≥ τ_ρ^B]): the policy gradient is kept only where the
  token entropy reaches τ_ρ^B, the threshold of the top ρ (= 0.2) of the batch's tokens.

  Note: τ_ρ is the k-th largest valid entropy with k = max(1, ⌈ρ·N⌉) (an order statistic,
  no interpolation); ties at τ_ρ are all kept. With `axis_name` the entropies of every
  device are gathered so the threshold is global; the result is still local.

  Args:
    entropy_bt: per-token entropy, float [B, T] (treat as a constant: stop-gradient).
    mask: [B, T].
    top_fraction: ρ in (0, 1].
    axis_name: mapped axis for a global threshold, or None.
  Returns:
    float32 mask [B, T] of kept tokens (subset of `mask`); all 0 if `mask` is empty.
  """
  chex.assert_rank(entropy_bt, 2)
  chex.assert_equal_shape((entropy_bt, mask))
  if not 0.0 < top_fraction <= 1.0:
    raise ValueError(f"top_fraction must be in (0, 1], got {top_fraction}")
  valid = mask > 0
  ent = jax.lax.stop_gradient(jnp.where(valid, entropy_bt, -jnp.inf)).astype(jnp.float32)
  flat = ent.reshape(-1)
  if axis_name is not None:
    flat = jax.lax.all_gather(flat, axis_name, tiled=True)
  n_valid = masked_count(mask, axis_name=axis_name)
  k = jnp.maximum(1, jnp.ceil(top_fraction * n_valid).astype(jnp.int32))
  ordered = jnp.sort(flat)[::-1]
  tau = ordered[jnp.clip(k - 1, 0, flat.shape[0] - 1)]
  keep = valid & (ent >= tau) & (n_valid > 0)
  return keep.astype(jnp.float32)


def psr_nsr_weights(advantages_or_scores, *, positive_weight, negative_weight,
                    threshold=0.0):
  """Per-sample weights for positive/negative sample reinforcement (PSR/NSR/W-REINFORCE).

  Zhu et al. 2025, "The Surprising Effectiveness of Negative Reinforcement in LLM
  Reasoning", arXiv:2506.01347, Sec. 3 (PSR and NSR objectives) and Sec. 5
  (W-REINFORCE: L = λ·L_PSR + L_NSR with λ = 0.1). A sample is positive when its value
  > `threshold` (so {0, 1} scores, {−1, 1} scores and advantages all work). Presets in
  `PSR_NSR_PRESETS`. Multiply the weights into the advantage (or the per-token loss).

  Args:
    advantages_or_scores: float [B] or [B, T].
    positive_weight: weight of positive samples (λ for W-REINFORCE; 0 for NSR).
    negative_weight: weight of negative samples (0 for PSR).
    threshold: sign threshold.
  Returns:
    weights, float32, same shape.
  """
  positive = advantages_or_scores > threshold
  return jnp.where(positive, positive_weight, negative_weight).astype(jnp.float32)


def overlong_filter_mask(mask, truncated_b):
  """DAPO overlong filtering: drop every token of a truncated completion from the loss.

  Yu et al. 2025, "DAPO", arXiv:2503.14476, Sec. 3.4 (overlong filtering; the mask
  excludes truncated samples from the loss, TRL `mask_truncated_completions`).

  Args:
    mask: token mask [B, T].
    truncated_b: bool [B], True where generation hit the length limit without EOS.
  Returns:
    mask with truncated rows zeroed, same dtype and shape as `mask`.
  """
  chex.assert_rank([mask, truncated_b], [2, 1])
  chex.assert_equal_shape_prefix((mask, truncated_b), 1)
  return jnp.where(truncated_b[:, None], jnp.zeros_like(mask), mask)

