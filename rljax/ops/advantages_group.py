"""More group estimators and sample weights: OPO, GPG, GRPO pass@k (best-only), the
optimal token baseline, GDPO's decoupled normalisation, and PF-PPO reweighting.

Same conventions as `rljax.ops.advantages`: group arrays are `[B, G]` (B prompts, G
samples each) reduced over the last axis, `mask_bg` marks samples that count, outputs
are 0 where invalid.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from rljax.ops.advantages import group_advantages, group_mean_std, valid_mask
from rljax.ops.stats import safe_divide

PF_PPO_METHODS = ("pow", "max_min", "max_random")
GPG_ALPHA = ("authors", "verl")
GDPO_WHITEN_OVER = ("samples", "tokens")


def opo_advantages(scores_bg, lengths_bg, *, mask_bg=None):
  """OPO: Â_i = r_i − b with the length-weighted optimal baseline b = Σ_j |y_j| r_j / Σ_j |y_j|.

  "On-Policy RL with Optimal Reward Baseline" (2025), arXiv:2505.23585 (the
  optimal baseline under the assumption that gradient norms grow with length; verl
  `opo`). No std scaling. A group with one valid sample gets b = 0 (verl).

  Args:
    scores_bg: float [B, G].
    lengths_bg: completion lengths |y|, [B, G].
    mask_bg: optional [B, G] validity.
  Returns:
    advantages, float32 [B, G]; 0 where invalid.
  """
  chex.assert_rank(scores_bg, 2)
  chex.assert_equal_shape((scores_bg, lengths_bg))
  valid = valid_mask(mask_bg, scores_bg)
  r = jnp.where(valid, scores_bg, 0.0).astype(jnp.float32)
  w = jnp.where(valid, lengths_bg, 0.0).astype(jnp.float32)
  baseline = safe_divide(jnp.sum(w * r, -1, keepdims=True), jnp.sum(w, -1, keepdims=True))
  n = jnp.sum(valid, axis=-1, keepdims=True)
  baseline = jnp.where(n < 2, 0.0, baseline)
  return jnp.where(valid, r - baseline, 0.0)


def gpg_advantages(scores_bg, *, f_norm=1.0, mask_bg=None, alpha="authors"):
  """GPG advantage Â_i = α·(r_i − mean_g r)/F_norm, α = N/(N − M) (or verl's α).

  Chu et al. 2025, "GPG: A Simple and Strong Reinforcement Learning Baseline for Model
  Reasoning", arXiv:2504.02546 (accurate gradient estimation): M of the N samples sit in
  groups whose rewards are all equal and have zero advantage; α rescales the batch
  gradient so that it is the mean over the N − M samples that carry a signal.

  `alpha` picks the convention:
    "authors"  α = N/(N − M), the paper's definition.
    "verl"     α = N/max(count_nonzero(r), 1), verl `compute_gpg_outcome_advantage`
               (`bsz / m.clamp(min=1)` with `m = torch.count_nonzero(scores)`).
  Note: the two agree only when the samples with a non-zero score are exactly those in
  groups with a spread. verl's α counts non-zero *scores*, so it depends on where the
  reward puts its zero: with 0/1 rewards it is N/#correct (16 samples in four groups of
  four, (1,0,0,0), (1,1,0,0), (0,0,0,0), (1,1,1,1): "authors" 16/8 = 2, "verl"
  16/7 ≈ 2.29); with ±1 rewards it is always 1. N, M and the count are over this call's
  valid samples (verl: over its batch). α = 1 under "authors" when no group is
  degenerate; α = N when every group is (the advantages are then all 0 anyway). A group
  with one valid sample has mean 0 (verl).

  Args:
    scores_bg: float [B, G].
    f_norm: F_norm, a constant divisor (1 in the paper's main setting).
    mask_bg: optional [B, G] validity.
    alpha: "authors" or "verl".
  Returns:
    advantages, float32 [B, G]; 0 where invalid.
  """
  if alpha not in GPG_ALPHA:
    raise ValueError(f"Unknown GPG alpha {alpha!r}; valid: {GPG_ALPHA}")
  chex.assert_rank(scores_bg, 2)
  valid = valid_mask(mask_bg, scores_bg)
  r = jnp.where(valid, scores_bg, 0.0).astype(jnp.float32)
  mean, _ = group_mean_std(r, valid)
  n = jnp.sum(valid).astype(jnp.float32)
  if alpha == "authors":
    spread = (jnp.max(jnp.where(valid, r, -jnp.inf), -1)
              - jnp.min(jnp.where(valid, r, jnp.inf), -1))
    degenerate = (spread <= 0)[:, None] & valid
    informative = n - jnp.sum(degenerate).astype(jnp.float32)
  else:
    informative = jnp.sum(valid & (r != 0)).astype(jnp.float32)
  scale = n / jnp.maximum(informative, 1.0)
  return jnp.where(valid, scale * (r - mean) / f_norm, 0.0)


def grpo_passk_advantages(scores_bg, *, scale_by_std=True, eps=1e-6, mask_bg=None):
  """GRPO pass@k: only each group's best sample is reinforced, by r_max − r_second.

  Â_best = (r_(1) − r_(2))/(std_g r + ε), every other sample 0 (verl `grpo_passk`, which
  cites arXiv:2503.19595 for it): the group is credited for its best answer only, by how
  much it beats the runner-up, i.e. for the gain pass@k gets from that sample.

  Note: ties for the maximum go to the first such sample (torch.topk's order), which then
  gets r_(1) − r_(2) = 0. std is unbiased (ddof = 1). verl raises on groups with fewer
  than two samples; here they get 0.

  Args:
    scores_bg: float [B, G].
    scale_by_std: divide by the group std (verl `norm_adv_by_std_in_grpo`).
    eps: ε in the denominator.
    mask_bg: optional [B, G] validity.
  Returns:
    advantages, float32 [B, G]; 0 where invalid and for every non-best sample.
  """
  chex.assert_rank(scores_bg, 2)
  valid = valid_mask(mask_bg, scores_bg)
  r = jnp.where(valid, scores_bg, -jnp.inf).astype(jnp.float32)
  best = jnp.argmax(r, axis=-1)
  top2 = jax.lax.top_k(r, 2)[0]
  gap = top2[:, 0] - top2[:, 1]
  n = jnp.sum(valid, axis=-1)
  if scale_by_std:
    _, std = group_mean_std(jnp.where(valid, r, 0.0), valid)
    gap = gap / (std[:, 0] + eps)
  gap = jnp.where(n >= 2, gap, 0.0)
  one_hot = jax.nn.one_hot(best, r.shape[-1], dtype=bool)
  return jnp.where(one_hot & valid, gap[:, None], 0.0)


def optimal_token_baseline_advantages(returns_bgt, logp_bgt, sum_pi_sq_bgt, mask_bgt, *,
                                      eps=1e-8, handle_zero_tail=True):
  """Optimal token baseline: a per-step baseline weighted by accumulated path variance.

  Â_t = G_t − B*_t,  B*_t = Σ_i G_{i,t}·W_{i,t} / (Σ_i W_{i,t} + ε),
  W_{i,t} = Σ_{j ≤ t} (1 − 2π_{i,j} + Σ_v π_{i,j,v}²)
  where π_{i,j} is the probability of the sampled token and 1 − 2π + Σπ² = ‖∇_z logπ‖² is
  the squared norm of the log-prob's gradient w.r.t. the logits (the "logit-gradient
  proxy" of the variance). The sums over i run over a prompt's G samples at the same step t
  (verl `optimal_token_baseline`; Li, "Optimal Token Baseline", blog, 2025 — no arXiv id).

  Zero tail (`handle_zero_tail`, verl's argument of the same name and default): a step t
  that only one sample of the group reaches — the tail of the group's unique longest
  response, past the second-longest — has a baseline made of that sample alone,
  B*_t = G_t·W_t/(W_t + ε) ≈ G_t, so Â_t ≈ 0: those tokens, the response's final (stop)
  token among them, get no gradient whatever the reward. With the handling on, B*_t = 0
  there and Â_t = G_t, the rule already used for a group of one sample (there is nothing
  to compare with, so no baseline): unbiased, with the variance of an unbaselined return.
  Default True: otherwise the longest response of every group never learns from how it
  ends, and a step with one sample would be treated unlike a group with one sample.

  Note: groups with fewer than two samples that have a valid token get B* = 0 (verl counts
  every member of the group, also one with no valid token; that matters only with
  `handle_zero_tail=False`). The zero tail is applied per step: B*_t = 0 where exactly one
  sample has a valid token at t. For completion masks (1 from the first token to EOS) this
  is verl's rule (positions ≥ the second-longest length, on the unique longest sample);
  for masks with holes it is the same idea per position (verl's multi-turn variant aligns
  the k-th *valid* token of each sample instead). verl's IS scaling of W is not included.

  Args:
    returns_bgt: rewards-to-go G_t, float [B, G, T] (the outcome score on every real
      token for outcome rewards).
    logp_bgt: log-probs of the sampled tokens under the sampling policy, [B, G, T].
    sum_pi_sq_bgt: Σ_v π_v² of the full next-token distribution, [B, G, T].
    mask_bgt: [B, G, T].
    eps: ε in the denominator.
    handle_zero_tail: baseline 0 at steps only one sample of the group reaches.
  Returns:
    advantages, float32 [B, G, T]; 0 at masked positions.
  """
  chex.assert_rank(returns_bgt, 3)
  chex.assert_equal_shape((returns_bgt, logp_bgt, sum_pi_sq_bgt, mask_bgt))
  m = (mask_bgt > 0).astype(jnp.float32)
  g = returns_bgt.astype(jnp.float32) * m
  w_step = (1.0 - 2.0 * jnp.exp(logp_bgt.astype(jnp.float32)) + sum_pi_sq_bgt) * m
  w = jnp.cumsum(w_step, axis=-1) * m
  baseline = jnp.sum(g * w, axis=1, keepdims=True) / (jnp.sum(w, axis=1, keepdims=True) + eps)
  single = jnp.sum(jnp.any(m > 0, axis=-1), axis=1, keepdims=True)[..., None] < 2
  baseline = jnp.where(single, 0.0, baseline)                       # [B, 1, T]
  if handle_zero_tail:
    alone = jnp.sum(m, axis=1, keepdims=True) == 1.0                # one sample at step t
    baseline = jnp.where(alone, 0.0, baseline)
  return (g - baseline) * m


def gdpo_advantages(rewards_bgk, weights_k, *, eps=1e-6, mask_bg=None, whiten_over="samples",
                    lengths_bg=None):
  """GDPO: each reward normalised within its group, weighted sum, then batch-normalised.

  A_k = (r_k − mean_g r_k)/(std_g r_k + ε),  A = Σ_k w_k·A_k,
  Â = (A − mean_batch A)/(std_batch A + ε).
  "GDPO: Group reward-Decoupled Normalization Policy Optimization for Multi-reward RL
  Optimization" (Liu et al. 2026, arXiv:2601.05242, Sec. 3); TRL
  `multi_objective_aggregation="normalize_then_sum"`. With several rewards GRPO's
  normalise-the-sum maps different reward combinations to the same advantage (a group
  with rewards (1, 0) and one with (0, 1) look alike); normalising each reward first keeps
  them apart.

  `whiten_over` sets what the batch statistics weigh:
    "samples"  every valid sample once (TRL, which whitens its per-sample rewards).
    "tokens"   every valid sample |y_i| times, as verl `compute_gdpo_outcome_advantage`
               does by broadcasting A over the response and calling `masked_whiten` on
               the token mask: mean_batch = Σ|y_i|A_i/Σ|y_i|, and a variance with ddof = 1
               over the Σ|y_i| tokens. Longer responses pull the mean and the spread
               towards their advantages. Needs `lengths_bg`.

  Note: the group std is the unbiased one of `group_advantages` (a reward constant within a
  group contributes 0); the batch variance has ddof = 1 over samples or over tokens.
  ε sits outside the square root in both modes; verl whitens with (A − μ)·rsqrt(σ² + 1e-8),
  a relative difference below 1e-5 unless σ is tiny.

  Args:
    rewards_bgk: K reward components per sample, float [B, G, K] (unweighted).
    weights_k: float [K].
    eps: ε of both normalisations.
    mask_bg: optional [B, G] validity.
    whiten_over: "samples" or "tokens".
    lengths_bg: completion lengths |y_i| (valid tokens per sample), [B, G]; only for
      "tokens".
  Returns:
    advantages, float32 [B, G]; 0 where invalid.
  """
  if whiten_over not in GDPO_WHITEN_OVER:
    raise ValueError(f"Unknown GDPO whiten_over {whiten_over!r}; valid: {GDPO_WHITEN_OVER}")
  chex.assert_rank(rewards_bgk, 3)
  chex.assert_shape(weights_k, rewards_bgk.shape[2:])
  valid = valid_mask(mask_bg, rewards_bgk[..., 0])
  per_reward = jax.vmap(lambda r_bg: group_advantages(r_bg, eps=eps, mask_bg=valid),
                        in_axes=2, out_axes=2)(rewards_bgk.astype(jnp.float32))
  summed = jnp.sum(per_reward * jnp.asarray(weights_k, jnp.float32), axis=-1)   # [B, G]
  if whiten_over == "samples":
    weight = valid.astype(jnp.float32)
  else:
    if lengths_bg is None:
      raise ValueError('gdpo_advantages(whiten_over="tokens") needs lengths_bg')
    chex.assert_equal_shape((lengths_bg, summed))
    weight = jnp.where(valid, lengths_bg, 0).astype(jnp.float32)
  total = jnp.sum(weight)
  mean = safe_divide(jnp.sum(weight * summed), total)
  sq = jnp.sum(weight * jnp.square(summed - mean))
  std = jnp.sqrt(jnp.where(total > 1.0, safe_divide(sq, total - 1.0), 0.0))
  return jnp.where(valid, (summed - mean) / (std + eps), 0.0)


def pf_ppo_weights(scores_b, *, method="pow", power=2.0):
  """PF-PPO sampling weights of each sequence from its reward (policy filtration).

  "pow":        w = |r|^p        (keeps confident rewards, drops ones near 0)
  "max_min":    w = 1 for the batch's highest and lowest rewards, else 0
  "max_random": w = 0.4 for the batch's highest reward, else 0.1
  "Policy Filtration in RLHF to Fine-Tune LLM for Code Generation" (2024),
  arXiv:2409.06957 (PF-PPO; verl `compute_pf_ppo_reweight_data`).

  Note: like verl, 1e-8 is added so a batch with all weights 0 stays samplable.

  Args:
    scores_b: sequence rewards, float [B].
    method: "pow", "max_min" or "max_random".
    power: the exponent p of "pow".
  Returns:
    unnormalised weights, float32 [B], > 0.
  """
  if method not in PF_PPO_METHODS:
    raise ValueError(f"Unknown PF-PPO method {method!r}; valid: {PF_PPO_METHODS}")
  chex.assert_rank(scores_b, 1)
  r = scores_b.astype(jnp.float32)
  if method == "pow":
    w = jnp.power(jnp.abs(r), power)
  elif method == "max_min":
    w = ((r == jnp.max(r)) | (r == jnp.min(r))).astype(jnp.float32)
  else:
    w = jnp.where(r == jnp.max(r), 0.4, 0.1)
  return jnp.maximum(w + 1e-8, 1e-8)


def pf_ppo_resample(key, weights_b):
  """Row indices [B] drawn with replacement, P(i) ∝ w_i (PF-PPO's filtered batch)."""
  chex.assert_rank(weights_b, 1)
  return jax.random.choice(key, weights_b.shape[0], shape=weights_b.shape,
                           p=weights_b / jnp.sum(weights_b))
