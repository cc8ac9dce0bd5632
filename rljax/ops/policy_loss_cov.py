"""Token covariance and the losses built on it: Clip-Cov's token selection and KL-Cov
(Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language
Models", arXiv:2505.22617).

Entropy collapses because the tokens whose log-probability covaries most with their
advantage dominate the update (Eq. 5). Clip-Cov stops the gradient of a random few of them
(`clip_cov_mask`; the loss, PPO with those tokens detached, is
`rljax.ops.policy_loss.clip_cov_loss`); KL-Cov puts a KL penalty on the top few. Same
contract as `rljax.ops.policy_loss`, registered there by name.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rljax.ops.policy_loss_common import advantages_bt as _advantages_bt
from rljax.ops.policy_loss_common import diagnostics as _diagnostics
from rljax.ops.ratios import token_log_ratio
from rljax.ops.stats import masked_mean


def token_covariance(logp, adv, mask):
  """Per-token covariance term Cov_t = (A_t − mean A)·(logπ_t − mean logπ), no gradient.

  Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language
  Models", arXiv:2505.22617, Eq. 11: the entropy change of a policy-gradient step follows
  the covariance of log-probability and advantage; Clip-Cov and KL-Cov act on the tokens
  with the largest terms. Means are over unmasked tokens of the batch.

  Args:
    logp: log-probs of the sampled tokens, [B, T].
    adv: advantages, [B, T].
    mask: [B, T].
  Returns:
    float32 [B, T], 0 at masked positions.
  """
  keep = mask > 0
  logp = jnp.where(keep, jax.lax.stop_gradient(logp).astype(jnp.float32), 0.0)
  cov = (adv - masked_mean(adv, mask)) * (logp - masked_mean(logp, mask))
  return jnp.where(keep, cov, 0.0)


def _select_top(priority, eligible, n_tokens, fraction):
  """Eligible positions among the k = max(⌊fraction·n_tokens⌋, 1) highest priorities.

  Ranks with a stable sort (ties break by position), so k is a traced value: jit-able.
  """
  flat = jnp.where(eligible, priority, -jnp.inf).ravel()
  order = jnp.argsort(-flat, stable=True)
  rank = jnp.zeros(flat.shape, jnp.int32).at[order].set(jnp.arange(flat.size, dtype=jnp.int32))
  k = jnp.maximum(jnp.floor(fraction * n_tokens), 1.0)
  return eligible & (rank.reshape(priority.shape) < k)


def clip_cov_mask(logp, old_logp, advantages, mask, *, key, clip_fraction=2e-4,
                  cov_low=1.0, cov_high=5.0, eps_low=1.0, eps_high=1.0):
  """Clip-Cov token selection: 0 for the tokens whose gradient is detached, else 1.

  Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language
  Models", arXiv:2505.22617, §4.2: Cov_t = (A_t − Ā)(logπ_t − mean logπ) over the batch's
  tokens; among tokens with cov_low < Cov_t < cov_high that the PPO clip has not already
  clipped, pick k = max(⌊clip_fraction·N⌋, 1) uniformly at random (N = unmasked tokens).

  Note: the random choice uses `key` (pure, jit-able: a random priority per token and a
  rank among the candidates). Means and N are over this call's batch, i.e. per device
  shard under data parallelism, as in verl.

  Args:
    logp, old_logp: current / old log-probs, [B, T].
    advantages: [B] or [B, T].
    mask: completion mask, [B, T].
    key: PRNG key for the random selection.
    clip_fraction: fraction r of tokens to detach (paper and verl: 2e-4).
    cov_low, cov_high: covariance band (ω_low, ω_high) = (1, 5).
    eps_low, eps_high: the PPO clip used to tell already-clipped tokens.
  Returns:
    float32 [B, T]: 0 for selected tokens, 1 elsewhere (also 1 at masked positions).
  """
  adv = _advantages_bt(advantages, mask)
  ratio = jnp.exp(token_log_ratio(logp, old_logp, mask))
  already = ((adv > 0) & (ratio > 1 + eps_high)) | ((adv < 0) & (ratio < 1 - eps_low))
  cov = token_covariance(logp, adv, mask)
  eligible = (mask > 0) & ~already & (cov > cov_low) & (cov < cov_high)
  priority = jax.random.uniform(key, mask.shape)
  n_tokens = jnp.sum((mask > 0).astype(jnp.float32))
  selected = _select_top(priority, eligible, n_tokens, clip_fraction)
  return 1.0 - selected.astype(jnp.float32)


def kl_cov_loss(logp, old_logp, advantages, mask, *, kl_fraction=2e-4, kl_coef=1.0):
  """KL-Cov loss: −A·r, plus kl_coef·|log r| on the top-k tokens by covariance.

  Cui et al. 2025, arXiv:2505.22617, §4.2 (KL-Cov): the k = max(⌊kl_fraction·N⌋, 1)
  unmasked tokens with the largest Cov_t = (A_t − Ā)(logπ_t − mean logπ) get a KL penalty
  to the old policy; no ratio clipping otherwise (verl `compute_policy_loss_kl_cov` in
  `verl/trainer/ppo/core_algos.py`; its entropy recipe: kl_fraction 2e-4, coef 1).

  Note: the KL penalty is verl's |log r| (k1 magnitude). Deterministic top-k, ties
  broken by position; means and N are per call (per device shard).

  Args:
    logp, old_logp: current / old log-probs, [B, T].
    advantages: [B] or [B, T].
    mask: completion mask, [B, T].
    kl_fraction: fraction of tokens penalised.
    kl_coef: penalty coefficient.
  Returns:
    (loss_bt [B, T], PolicyLossDiagnostics with `cov_selected_bt`).
  """
  adv = _advantages_bt(advantages, mask)
  log_r = token_log_ratio(logp, old_logp, mask)
  ratio = jnp.exp(log_r)
  cov = token_covariance(logp, adv, mask)
  n_tokens = jnp.sum((mask > 0).astype(jnp.float32))
  selected = _select_top(cov, mask > 0, n_tokens, kl_fraction)
  loss = -adv * ratio + jnp.where(selected, kl_coef * jnp.abs(log_r), 0.0)
  diag = _diagnostics(mask, ratio, log_r, cov_selected_bt=selected)
  return jnp.where(mask > 0, loss, 0.0), diag
