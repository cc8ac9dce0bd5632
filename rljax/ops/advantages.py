"""Advantage estimators: group baselines (GRPO, Dr.GRPO, RLOO, pass@k), REINFORCE++,
ReMax, and masked (optionally cross-device) whitening; GAE and discounted returns (the
recursions over time, `rljax.ops.returns`) are importable from here too.

Conventions (DESIGN.md): per-token arrays are `[B, T]` with a `mask` of the same shape;
group estimators take an explicit `[B, G]` array (B prompts, G samples each) and reduce
over the last axis. Rows of a flat rollout are ordered prompt-major, so
`x_bg.reshape(B * G)` matches `Rollout` order. Every output is 0 at masked positions and
values at masked positions never reach an output.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from rljax.ops.returns import discounted_returns, gae
from rljax.ops.stats import comb_ratio, masked_mean, masked_std, masked_var, safe_divide

# `gae` and `discounted_returns` live in `rljax.ops.returns`; they stay importable from here.
__all__ = ["batch_std_advantages", "discounted_returns", "gae", "group_advantages",
           "group_mean_std", "pass_at_k_advantages", "reinforce_pp_advantages",
           "reinforce_pp_baseline_advantages", "remax_advantages", "rloo_advantages",
           "valid_mask", "whiten"]


def valid_mask(mask_bg, scores_bg):
  """Boolean validity mask for a group array (all valid when `mask_bg` is None)."""
  if mask_bg is None:
    return jnp.ones(scores_bg.shape, bool)
  chex.assert_equal_shape((scores_bg, mask_bg))
  return mask_bg > 0


def whiten(x, mask, *, shift_mean=True, axis_name=None, eps=1e-8):
  """Masked whitening (x − μ)·rsqrt(σ² + ε), optionally adding μ back (`shift_mean=False`).

  The `whiten` of Ziegler et al. 2019, arXiv:1909.08593 (openai/lm-human-preferences): rewards
  are whitened with `shift_mean=False`, advantages with `shift_mean=True`. With `axis_name`
  the moments are global over the devices of that mapped axis (normalise over the global
  batch, not per data-parallel shard).

  Note: σ² is the biased (ddof = 0) variance, as in the seed's `torch.var(unbiased=False)`;
  verl's `masked_whiten` uses the unbiased one (identical up to n/(n−1)).

  Args:
    x: values, any shape.
    mask: same shape as x.
    shift_mean: False keeps the mean (whitened + μ).
    axis_name: mapped axis for global moments (inside `shard_map`/`pmap`), or None.
    eps: added to the variance inside rsqrt.
  Returns:
    whitened x, float32, same shape; 0 at masked positions.
  """
  chex.assert_equal_shape((x, mask))
  x = jnp.where(mask > 0, x, 0.0).astype(jnp.float32)
  mean = masked_mean(x, mask, axis_name=axis_name)
  var = masked_var(x, mask, axis_name=axis_name)
  out = (x - mean) * jax.lax.rsqrt(var + eps)
  if not shift_mean:
    out = out + mean
  return jnp.where(mask > 0, out, 0.0)


def group_mean_std(scores_bg, valid):
  """Group mean and unbiased std over G; a group with < 2 valid samples gets (0, 1) (verl)."""
  n = jnp.sum(valid, axis=-1, keepdims=True)
  mean = masked_mean(scores_bg, valid, axis=-1)[..., None]
  std = masked_std(scores_bg, valid, axis=-1, ddof=1)[..., None]
  singleton = n < 2
  return jnp.where(singleton, 0.0, mean), jnp.where(singleton, 1.0, std)


def group_advantages(scores_bg, *, scale_by_std=True, eps=1e-6, mask_bg=None):
  """GRPO group-normalised advantage Â_i = (r_i − mean_g r)/(std_g r + ε); Dr.GRPO without std.

  Shao et al. 2024, "DeepSeekMath", arXiv:2402.03300, Sec. 4.1.2 (outcome supervision);
  `scale_by_std=False` is Dr.GRPO, Liu et al. 2025, "Understanding R1-Zero-Like Training:
  A Critical Perspective", arXiv:2503.20783, Sec. 3.2 (Â_i = r_i − mean_g r).

  Note: std is the unbiased (ddof = 1) sample std, as in verl/TRL/tunix; ε sits outside
  the square root, (r − μ)/(σ + ε) (verl/tunix ε = 1e-6, TRL 1e-4). A group with fewer than
  two valid samples uses mean 0 and std 1 (verl), i.e. Â = r/(1 + ε). A group whose scores
  are all equal gets Â = 0.

  Args:
    scores_bg: sequence scores, float [B, G].
    scale_by_std: divide by the group std (GRPO) or not (Dr.GRPO).
    eps: ε in the denominator.
    mask_bg: optional [B, G], 0 for samples that do not count (e.g. failed scoring).
  Returns:
    advantages, float32 [B, G]; 0 where `mask_bg` is 0.
  """
  chex.assert_rank(scores_bg, 2)
  valid = valid_mask(mask_bg, scores_bg)
  scores_bg = jnp.where(valid, scores_bg, 0.0).astype(jnp.float32)
  mean, std = group_mean_std(scores_bg, valid)
  adv = scores_bg - mean
  if scale_by_std:
    adv = adv / (std + eps)
  return jnp.where(valid, adv, 0.0)


def batch_std_advantages(scores_bg, *, eps=1e-6, mask_bg=None, axis_name=None):
  """Group-mean baseline scaled by the batch std: Â_i = (r_i − mean_g r)/(std_batch r + ε).

  Liu et al. 2025, "Part I: Tricks or Traps? A Deep Dive into RL for LLM Reasoning",
  arXiv:2508.08221, Sec. 4 (advantage normalisation: group-level mean, batch-level std,
  the normalisation of "Lite PPO").

  Note: std_batch is the unbiased (ddof = 1) std of the raw scores over every valid sample
  of the batch (of all devices when `axis_name` is set); singleton groups use mean 0.

  Args:
    scores_bg: float [B, G].
    eps: ε outside the square root.
    mask_bg: optional [B, G] validity.
    axis_name: mapped axis for a global batch std, or None.
  Returns:
    advantages, float32 [B, G]; 0 where invalid.
  """
  chex.assert_rank(scores_bg, 2)
  valid = valid_mask(mask_bg, scores_bg)
  scores_bg = jnp.where(valid, scores_bg, 0.0).astype(jnp.float32)
  mean, _ = group_mean_std(scores_bg, valid)
  std = masked_std(scores_bg, valid, axis_name=axis_name, ddof=1)
  return jnp.where(valid, (scores_bg - mean) / (std + eps), 0.0)


def rloo_advantages(scores_bg, *, mask_bg=None):
  """REINFORCE leave-one-out: Â_i = r_i − (Σ_{j≠i} r_j)/(n − 1).

  Kool et al. 2019, "Buy 4 REINFORCE Samples, Get a Baseline for Free!" (ICLR workshop,
  leave-one-out baseline); Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE
  Style Optimization for Learning from Human Feedback in LLMs", arXiv:2402.14740 (RLOO
  estimator, Sec. 3). Equals verl's
  r·n/(n−1) − mean·n/(n−1).

  Note: a group with fewer than two valid samples has no baseline and gets Â = 0 (tunix;
  TRL zeroes the NaN), where verl keeps the raw score.

  Args:
    scores_bg: float [B, G].
    mask_bg: optional [B, G] validity; n counts valid samples per group.
  Returns:
    advantages, float32 [B, G]; 0 where invalid.
  """
  chex.assert_rank(scores_bg, 2)
  valid = valid_mask(mask_bg, scores_bg)
  scores_bg = jnp.where(valid, scores_bg, 0.0).astype(jnp.float32)
  n = jnp.sum(valid, axis=-1, keepdims=True).astype(jnp.float32)
  total = jnp.sum(scores_bg, axis=-1, keepdims=True)
  baseline = safe_divide(total - scores_bg, n - 1.0)
  return jnp.where(valid & (n >= 2), scores_bg - baseline, 0.0)


def reinforce_pp_advantages(rewards_bt, mask, *, gamma, axis_name=None):
  """REINFORCE++: discounted token returns, whitened over the (global) batch.

  Hu 2025, "REINFORCE++: An Efficient RLHF Algorithm with Robustness to Both Prompt and
  Reward Models", arXiv:2501.03262, Sec. 3 (token-level returns with the KL penalty in
  the reward, global advantage normalisation). G_t = r_t + γG_{t+1}, reset after EOS, then
  `whiten(G, mask, axis_name=axis_name)` (verl `compute_reinforce_plus_plus_outcome_advantage`).

  Note: whitening uses the biased (ddof = 0) variance and ε = 1e-8 inside rsqrt (`whiten`);
  verl's `masked_whiten` uses the unbiased variance. Masked tokens are skipped, not reset
  (identical for masks without interior gaps; see `gae`).

  Args:
    rewards_bt: per-token rewards (score on the last token − β·KL), float [B, T].
    mask: [B, T].
    gamma: discount γ.
    axis_name: mapped axis for global whitening, or None.
  Returns:
    advantages, float32 [B, T]; 0 at masked positions.
  """
  returns = discounted_returns(rewards_bt, mask, gamma=gamma)
  return whiten(returns, mask, axis_name=axis_name)


def reinforce_pp_baseline_advantages(scores_bg, mask_bgt, *, axis_name=None):
  """REINFORCE++-baseline: subtract the group mean, broadcast over tokens, batch-whiten.

  Hu 2025, arXiv:2501.03262 (REINFORCE++-baseline variant); verl
  `compute_reinforce_plus_plus_baseline_outcome_advantage`. Singleton groups use mean 0.

  Note: the whitening is over tokens (each sequence weighs by its length), as in verl.

  Args:
    scores_bg: sequence scores, float [B, G].
    mask_bgt: token mask [B, G, T].
    axis_name: mapped axis for global whitening, or None.
  Returns:
    advantages, float32 [B, G, T]; 0 at masked positions.
  """
  chex.assert_rank([scores_bg, mask_bgt], [2, 3])
  chex.assert_equal_shape_prefix((scores_bg, mask_bgt), 2)
  adv_bg = group_advantages(scores_bg, scale_by_std=False)
  adv_bgt = jnp.broadcast_to(adv_bg[..., None], mask_bgt.shape)
  return whiten(adv_bgt, mask_bgt, axis_name=axis_name)


def remax_advantages(scores_b, greedy_scores_b):
  """ReMax: baseline = reward of the greedy completion, Â = r(x, y) − r(x, ȳ_greedy).

  Li et al. 2023, "ReMax: A Simple, Effective, and Efficient Reinforcement Learning Method
  for Aligning Large Language Models", arXiv:2310.10505, Algorithm 1 (greedy baseline).

  Args:
    scores_b: scores of sampled completions, float [B].
    greedy_scores_b: score of the greedy completion of the same prompt, float [B].
  Returns:
    advantages, float32 [B] (broadcast over the sequence's tokens by the caller).
  """
  chex.assert_rank(scores_b, 1)
  chex.assert_equal_shape((scores_b, greedy_scores_b))
  return (scores_b - greedy_scores_b).astype(jnp.float32)


def pass_at_k_advantages(scores_bg, *, k, threshold=0.5, mask_bg=None):
  """Analytical Pass@k-training advantage for binary rewards.

  Chen et al. 2025, "Pass@k Training for Adaptively Balancing Exploration and Exploitation
  of Large Reasoning Models", arXiv:2508.10751, Sec. 3.3 (analytical derivation). With N
  samples of which N_neg are wrong, the group reward (pass@k over all size-k subsets) is
  R̄ = 1 − C(N_neg, k)/C(N, k), σ = sqrt(R̄(1 − R̄)), and
    Â_pos = (1 − R̄)/σ,
    Â_neg = (1 − R̄ − C(N_neg − 1, k − 1)/C(N − 1, k − 1))/σ,
  which is the mean, over the subsets containing a response, of the subset's normalised
  reward (max of its members). k = 1 gives GRPO with the biased (ddof = 0) std.

  Note: σ = 0 (all right, all wrong, N_neg < k, or fewer than k valid samples) gives
  Â = 0 (no ε). A sample is
  correct when its score > `threshold` (works for {0, 1} and {−1, 1} rewards).

  Args:
    scores_bg: float [B, G].
    k: subset size, 1 ≤ k ≤ number of valid samples.
    threshold: correctness threshold on the score.
    mask_bg: optional [B, G] validity; N counts valid samples per group.
  Returns:
    advantages, float32 [B, G]; 0 where invalid.
  """
  chex.assert_rank(scores_bg, 2)
  valid = valid_mask(mask_bg, scores_bg)
  correct = valid & (scores_bg > threshold)
  n = jnp.sum(valid, axis=-1, keepdims=True).astype(jnp.float32)
  n_neg = n - jnp.sum(correct, axis=-1, keepdims=True).astype(jnp.float32)
  mean = 1.0 - comb_ratio(n_neg, n, k)
  sigma = jnp.sqrt(jnp.clip(mean * (1.0 - mean), 0.0, None))
  p_all_neg = comb_ratio(n_neg - 1.0, n - 1.0, k - 1)
  adv = jnp.where(correct, 1.0 - mean, 1.0 - mean - p_all_neg)
  return jnp.where(valid, safe_divide(adv, sigma), 0.0)
