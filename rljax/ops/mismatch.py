"""Train–inference mismatch correction: truncated and masked importance sampling between
the sampler (inference engine) and the trainer's recomputed log-probs, sequence masks,
and mismatch diagnostics.

w = π_trainer(y_t)/π_sampler(y_t), with log w clamped to ±`LOG_RATIO_CLAMP` before exp.
Weights are returned under `stop_gradient`: they multiply the policy-gradient term as
constants. Per-sequence weights are broadcast over the sequence's tokens.
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from rljax.ops.stats import masked_count, masked_mean, masked_sum, safe_divide

LOG_RATIO_CLAMP = 20.0
LEVELS = ("token", "sequence", "geometric")


def _check(logp_trainer, logp_sampler, mask):
  chex.assert_rank(logp_trainer, 2)
  chex.assert_equal_shape((logp_trainer, logp_sampler, mask))


def mismatch_log_ratio(logp_trainer, logp_sampler, mask, *, level="token"):
  """log w at the chosen level, broadcast to [B, T], clamped to ±LOG_RATIO_CLAMP.

  level: "token" log w_t = logπ_trainer − logπ_sampler; "sequence" Σ_t m·log w_t (the
  product ratio, verl rollout_corr); "geometric" the per-token mean of log w_t (the
  length-normalised ratio of GSPO).

  Args:
    logp_trainer: trainer log-probs of the sampled tokens (old_logp), float [B, T].
    logp_sampler: sampler log-probs (`Rollout.logp`), float [B, T].
    mask: [B, T].
    level: one of LEVELS.
  Returns:
    log-ratio, float32 [B, T], 0 at masked positions.
  """
  _check(logp_trainer, logp_sampler, mask)
  valid = mask > 0
  log_w = jnp.where(valid, logp_trainer - logp_sampler, 0.0).astype(jnp.float32)
  if level == "sequence":
    log_w = jnp.broadcast_to(jnp.sum(log_w, axis=-1, keepdims=True), log_w.shape)
  elif level == "geometric":
    seq = masked_mean(log_w, mask, axis=-1)[:, None]
    log_w = jnp.broadcast_to(seq, log_w.shape)
  elif level != "token":
    raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
  log_w = jnp.clip(log_w, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
  return jax.lax.stop_gradient(jnp.where(valid, log_w, 0.0))


def truncated_is_weights(logp_trainer, logp_sampler, mask, *, cap=2.0, level="token"):
  """Truncated importance sampling (TIS): w = min(π_trainer/π_sampler, C).

  Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL
  Training" (fengyao.notion.site/off-policy-rl; the TIS-corrected gradient
  E_{π_sampler}[min(π_fsdp/π_vllm, C)·∇logπ·A]). verl's default cap is C = 2
  (`verl/trainer/ppo/rollout_corr_helper.py`).

  Args:
    logp_trainer: float [B, T].
    logp_sampler: float [B, T].
    mask: [B, T].
    cap: C > 0.
    level: "token", "sequence" (product ratio) or "geometric".
  Returns:
    weights, float32 [B, T] (stop-gradient), 0 at masked positions.
  """
  log_w = mismatch_log_ratio(logp_trainer, logp_sampler, mask, level=level)
  return jnp.where(mask > 0, jnp.minimum(jnp.exp(log_w), cap), 0.0)


def icepop_weights(logp_trainer, logp_sampler, mask, *, low=0.5, high=5.0, level="token"):
  """Masked importance sampling (IcePop): M(w) = w if α ≤ w ≤ β else 0.

  Ling Team 2025, "Every Step Evolves: Scaling Reinforcement Learning for Trillion-Scale
  Thinking Model" (Ring-1T), arXiv:2510.18855, IcePop (double-sided masking calibration).
  Defaults [0.5, 5.0] follow OpenRLHF's `icepop` band. `level="sequence", low=0, high=3`
  reproduces TRL's default `sequence_mask` with C_max = 3.

  Args:
    logp_trainer: float [B, T].
    logp_sampler: float [B, T].
    mask: [B, T].
    low: α ≥ 0.
    high: β > α.
    level: "token", "sequence" or "geometric".
  Returns:
    weights, float32 [B, T] (stop-gradient), 0 at masked or rejected positions.
  """
  w = jnp.exp(mismatch_log_ratio(logp_trainer, logp_sampler, mask, level=level))
  keep = (mask > 0) & (w >= low) & (w <= high)
  return jnp.where(keep, w, 0.0)


def sequence_mask(logp_trainer, logp_sampler, mask, *, low, high, level="geometric"):
  """Rejects whole sequences whose ratio leaves [low, high] (no reweighting).

  Sequence-level rejection of the rollout-correction family (verl
  `verl/trainer/ppo/rollout_corr_helper.py`): keep sequence i iff low ≤ w_i ≤ high, with w_i the product ("sequence") or
  geometric-mean ("geometric") ratio.

  Args:
    logp_trainer: float [B, T].
    logp_sampler: float [B, T].
    mask: [B, T].
    low: lower bound on w (0 for none).
    high: upper bound on w.
    level: "sequence" or "geometric".
  Returns:
    keep, float32 [B] in {0, 1}; 0 for an empty row.
  """
  if level not in ("sequence", "geometric"):
    raise ValueError(f"level must be 'sequence' or 'geometric', got {level!r}")
  log_w = mismatch_log_ratio(logp_trainer, logp_sampler, mask, level=level)[:, 0]
  keep = (log_w >= jnp.log(low)) & (log_w <= jnp.log(high))
  return (keep & jnp.any(mask > 0, axis=-1)).astype(jnp.float32)


def off_policy_sequence_mask(logp_policy, logp_sampler, advantages_b, mask, *, delta):
  """Off-policy sequence masking (OPSM): keep i iff Â_i ≥ 0 or mean_t(logπ_sampler − logπ_θ) ≤ δ.

  DeepSeek-AI 2025, "DeepSeek-V3.2", arXiv:2512.02556, Sec. 3.1 (keep routing, off-policy
  sequence masking); TRL `get_off_policy_mask` (`trl/trainer/grpo_trainer.py`). Negative-advantage sequences
  that drifted too far from the sampler are dropped.

  Args:
    logp_policy: current policy log-probs logπ_θ, float [B, T].
    logp_sampler: sampler log-probs, float [B, T].
    advantages_b: sequence advantages, float [B].
    mask: [B, T].
    delta: δ, threshold on the mean per-token log-ratio.
  Returns:
    keep, float32 [B] in {0, 1} (stop-gradient).
  """
  _check(logp_policy, logp_sampler, mask)
  chex.assert_shape(advantages_b, (mask.shape[0],))
  gap = jnp.where(mask > 0, logp_sampler - logp_policy, 0.0).astype(jnp.float32)
  mean_gap = masked_mean(jax.lax.stop_gradient(gap), mask, axis=-1)
  return ((advantages_b >= 0) | (mean_gap <= delta)).astype(jnp.float32)


class MismatchDiagnostics(NamedTuple):
  """Scalars; global over devices when `axis_name` is set.

  logp_gap_mean: mean of logπ_trainer − logπ_sampler over valid tokens.
  logp_gap_abs_mean / logp_gap_abs_max: mean / max of its absolute value.
  kl_k1: KL(sampler ‖ trainer) ≈ mean(logπ_sampler − logπ_trainer) (tokens ~ sampler).
  kl_k3: same KL by the k3 estimator mean(w − 1 − log w), w = π_trainer/π_sampler.
  ess_token: (Σ_t w_t)²/(N·Σ_t w_t²) ∈ (0, 1], token weights.
  ess_seq: (Σ_i w_i)²/(B·Σ_i w_i²) ∈ (0, 1], sequence product weights (non-empty rows).
  """

  logp_gap_mean: jax.Array
  logp_gap_abs_mean: jax.Array
  logp_gap_abs_max: jax.Array
  kl_k1: jax.Array
  kl_k3: jax.Array
  ess_token: jax.Array
  ess_seq: jax.Array


def _ess_fraction(w, mask, axis_name):
  total = masked_sum(w, mask, axis_name=axis_name)
  sq = masked_sum(jnp.square(w), mask, axis_name=axis_name)
  return safe_divide(jnp.square(total), masked_count(mask, axis_name=axis_name) * sq)


def mismatch_diagnostics(logp_trainer, logp_sampler, mask, *, axis_name=None):
  """Sampler-vs-trainer mismatch diagnostics (verl rollout correction; Yao et al. 2025 TIS blog).

  ESS is Kong's effective sample size (Σw)²/Σw², reported as a fraction of the sample
  count (1 = no mismatch).

  Args:
    logp_trainer: float [B, T].
    logp_sampler: float [B, T].
    mask: [B, T].
    axis_name: mapped axis for global statistics, or None.
  Returns:
    MismatchDiagnostics of float32 scalars (0 for an empty mask).
  """
  _check(logp_trainer, logp_sampler, mask)
  valid = mask > 0
  log_w = mismatch_log_ratio(logp_trainer, logp_sampler, mask)
  w = jnp.where(valid, jnp.exp(log_w), 0.0)
  abs_gap = jnp.abs(log_w)
  gap_max = jnp.max(jnp.where(valid, abs_gap, 0.0))
  if axis_name is not None:
    gap_max = jax.lax.pmax(gap_max, axis_name)
  seq_log_w = mismatch_log_ratio(logp_trainer, logp_sampler, mask, level="sequence")[:, 0]
  seq_mask = jnp.any(valid, axis=-1)
  mean = lambda x: masked_mean(x, mask, axis_name=axis_name)  # noqa: E731
  return MismatchDiagnostics(
      logp_gap_mean=mean(log_w),
      logp_gap_abs_mean=mean(abs_gap),
      logp_gap_abs_max=gap_max,
      kl_k1=mean(-log_w),
      kl_k3=mean(w - 1.0 - log_w),
      ess_token=_ess_fraction(w, mask, axis_name),
      ess_seq=_ess_fraction(jnp.where(seq_mask, jnp.exp(seq_log_w), 0.0), seq_mask, axis_name),
  )
