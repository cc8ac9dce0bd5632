"""Per-iteration token statistics of a rollout batch: what the update is about to act on.

Analyse the rollout distribution before adding a trick. Entropy rises when
high-probability tokens are often negatives or low-probability tokens often positives;
it collapses when the covariance between log-prob and advantage stays positive (Cui et
al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language
Models", arXiv:2505.22617). These statistics make both visible once per iteration.

Everything here runs on the host on one batch (NumPy in, Python floats out), so the
trainer can write the dict straight to `metrics.jsonl`.
"""

from __future__ import annotations

import chex
import jax.numpy as jnp
import numpy as np

from rljax.ops.policy_loss_common import clip_by_probability_bt  # noqa: F401 (public here too)
from rljax.ops.policy_loss_cov import token_covariance
from rljax.ops.stats import masked_mean

ENTROPY_QUANTILES = (0.1, 0.5, 0.9)


def _advantages_bt(advantages, mask):
  """Advantages as float [B, T] (broadcast from [B])."""
  adv = np.asarray(advantages, np.float64)
  if adv.ndim == 1:
    adv = np.broadcast_to(adv[:, None], mask.shape)
  chex.assert_equal_shape((adv, mask))
  return adv


def _high_prob(logp_bt, valid, prob_split):
  """Valid tokens whose sampling probability exp(logp) is at least `prob_split`."""
  logp = np.where(valid, np.asarray(logp_bt, np.float64), -np.inf)
  return valid & (np.exp(logp) >= prob_split)


def _mean_or_nan(x):
  return float(np.mean(x)) if x.size else float("nan")


def entropy_summary(entropy_bt, advantages_bt, mask, *, quantiles=ENTROPY_QUANTILES):
  """Entropy quantiles over valid tokens, and mean entropy by advantage sign.

  Args:
    entropy_bt: per-token entropy of the sampling policy, float [B, T].
    advantages_bt: advantages, [B] or [B, T].
    mask: completion mask, [B, T].
    quantiles: quantile levels in [0, 1] (linear interpolation, as `np.quantile`).
  Returns:
    dict with "tokens/entropy_pXX" per level, "tokens/entropy_mean",
    "tokens/entropy_pos_adv" (tokens with A > 0), "tokens/entropy_neg_adv" (A < 0).
    A statistic over an empty set is NaN (undefined, not 0).
  """
  valid = np.asarray(mask) > 0
  ent = np.asarray(entropy_bt, np.float64)
  chex.assert_equal_shape((ent, valid))
  adv = _advantages_bt(advantages_bt, valid)
  h = ent[valid]
  out = {}
  for q in quantiles:
    out[f"tokens/entropy_p{round(100 * q):02d}"] = (
        float(np.quantile(h, q)) if h.size else float("nan"))
  out["tokens/entropy_mean"] = _mean_or_nan(h)
  out["tokens/entropy_pos_adv"] = _mean_or_nan(ent[valid & (adv > 0)])
  out["tokens/entropy_neg_adv"] = _mean_or_nan(ent[valid & (adv < 0)])
  return out


def logp_advantage_covariance(logp_bt, advantages_bt, mask):
  """Cov(log π, A) over the batch's valid tokens (the driver of entropy change).

  Cov = (1/N) Σ_t m_t (log π_t − mean log π)(A_t − mean A), means over valid tokens.

  Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning
  Language Models", arXiv:2505.22617, §3 (under natural policy gradient the entropy
  change is ΔH ≈ −η·Cov(log π, A); positive covariance means entropy falls) and §4.2
  (the token-wise centred cross-product that Clip-Cov and KL-Cov rank tokens by; this
  is its mean, computed with the same op, `rljax.ops.policy_loss_cov.token_covariance`).

  Note: the paper's covariance is per state under π; this is the batch estimate over
  sampled tokens (population form, divisor N), which is what the paper plots.

  Args:
    logp_bt: log-probs of the sampled tokens under the sampling (old) policy, [B, T].
    advantages_bt: [B] or [B, T].
    mask: [B, T].
  Returns:
    float; NaN if no token is valid.
  """
  mask = jnp.asarray(mask)
  if not bool(jnp.any(mask > 0)):
    return float("nan")
  adv = jnp.asarray(_advantages_bt(advantages_bt, np.asarray(mask)), jnp.float32)
  adv = jnp.where(mask > 0, adv, 0.0)
  cov_bt = token_covariance(jnp.asarray(logp_bt, jnp.float32), adv, mask)
  return float(masked_mean(cov_bt, mask))


def clip_breakdown(logp_bt, ratio_bt, advantages_bt, mask, *, eps_low=0.2, eps_high=0.2,
                   prob_split=0.5):
  """How many low- and high-probability tokens the PPO clip stopped, on each side.

  A token counts as clipped when the clipped branch of PPO's min(ρA, clip(ρ)A) is the
  active one (the same rule as `rljax.ops.policy_loss.policy_loss` diagnostics):
  high side: A > 0 and ρ > 1 + ε_high; low side: A < 0 and ρ < 1 − ε_low. Probability
  is the sampling policy's p = exp(logp); "low" means p < `prob_split`.

  DAPO's argument for clip-higher (Yu et al. 2025, arXiv:2503.14476, §3.1): the upper
  clip binds mostly on low-probability tokens (p = 0.01 may only reach 0.012 with
  ε = 0.2), so `clip_high_lowprob` counts the exploration that the clip prevents.

  Args:
    logp_bt: sampling-policy log-probs of the sampled tokens, [B, T].
    ratio_bt: importance ratio ρ the loss used (`PolicyLossDiagnostics.ratio_bt`), [B, T].
    advantages_bt: [B] or [B, T].
    mask: [B, T].
    eps_low, eps_high: the clip range of the loss.
    prob_split: probability threshold between "low" and "high" tokens.
  Returns:
    dict with counts "tokens/clip_{high,low}_{lowprob,highprob}" and the same keys with
    a "_frac" suffix (fraction of valid tokens; 0 for an empty mask).
  """
  valid = np.asarray(mask) > 0
  ratio = np.asarray(ratio_bt, np.float64)
  chex.assert_equal_shape((ratio, valid))
  adv = _advantages_bt(advantages_bt, valid)
  high_p = _high_prob(logp_bt, valid, prob_split)
  sides = {"high": (adv > 0) & (ratio > 1.0 + eps_high),
           "low": (adv < 0) & (ratio < 1.0 - eps_low)}
  n = max(int(valid.sum()), 1)
  out = {}
  for side, clipped in sides.items():
    for name, group in (("lowprob", ~high_p), ("highprob", high_p)):
      count = int(np.sum(valid & clipped & group))
      out[f"tokens/clip_{side}_{name}"] = float(count)
      out[f"tokens/clip_{side}_{name}_frac"] = count / n
  return out


def token_statistics(logp_bt, entropy_bt, advantages_bt, mask, *, ratio_bt=None,
                     eps_low=0.2, eps_high=0.2, prob_split=0.5):
  """All per-iteration token statistics of one batch as a flat dict of floats.

  Args:
    logp_bt: sampling-policy (old) log-probs of the sampled tokens, float [B, T].
    entropy_bt: per-token entropy of the sampling policy, float [B, T].
    advantages_bt: advantages, [B] or [B, T].
    mask: completion mask, [B, T]; masked positions never change any output.
    ratio_bt: optional ratio ρ used by the loss, [B, T]; adds the clip breakdown.
    eps_low, eps_high: clip range (only used with `ratio_bt`).
    prob_split: probability threshold between low- and high-probability tokens.
  Returns:
    dict[str, float] with keys "tokens/entropy_p10", "tokens/entropy_p50",
    "tokens/entropy_p90", "tokens/entropy_mean", "tokens/entropy_pos_adv",
    "tokens/entropy_neg_adv", "tokens/cov_logp_adv", "tokens/count",
    "tokens/highprob_frac" and, with `ratio_bt`, the keys of `clip_breakdown`.
  """
  chex.assert_rank([np.asarray(logp_bt), np.asarray(mask)], [2, 2])
  valid = np.asarray(mask) > 0
  out = entropy_summary(entropy_bt, advantages_bt, valid)
  out["tokens/cov_logp_adv"] = logp_advantage_covariance(logp_bt, advantages_bt, valid)
  n = int(valid.sum())
  out["tokens/count"] = float(n)
  out["tokens/highprob_frac"] = float(np.sum(_high_prob(logp_bt, valid, prob_split))) / max(n, 1)
  if ratio_bt is not None:
    out.update(clip_breakdown(logp_bt, ratio_bt, advantages_bt, valid, eps_low=eps_low,
                              eps_high=eps_high, prob_split=prob_split))
  return out


