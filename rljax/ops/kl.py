"""KL to a reference policy: per-token estimators, KL-in-reward, and β controllers.

With d = logπ_θ(y_t) − logπ_ref(y_t) for tokens sampled from π_θ (Schulman 2020,
"Approximating KL Divergence", joschu.net/blog/kl-approx.html; verl
`kl_penalty_forward` in `verl/trainer/ppo/core_algos.py`):

| kind         | per-token value                     | E_{π_θ}[·]             |
|--------------|-------------------------------------|------------------------|
| `k1`         | d                                   | KL(π_θ‖π_ref)          |
| `abs`        | |d|                                 | ≥ KL, biased           |
| `k2`         | ½ d²                                | ≈ KL (2nd order)       |
| `k3`         | e^{−d} + d − 1, d clamped to ±20    | KL(π_θ‖π_ref)          |
| `low_var_kl` | k3, then clamped to [−10, 10]       | KL (verl's default)    |
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from rljax.ops.ratios import LOG_RATIO_CLAMP, token_log_ratio

LOW_VAR_KL_CLAMP = 10.0


def _k1(d):
  return d


def _abs(d):
  return jnp.abs(d)


def _k2(d):
  return 0.5 * jnp.square(d)


def _k3(d):
  d = jnp.clip(d, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
  return jnp.expm1(-d) + d


def _low_var_kl(d):
  return jnp.clip(_k3(d), -LOW_VAR_KL_CLAMP, LOW_VAR_KL_CLAMP)


KL_ESTIMATORS = {"k1": _k1, "abs": _abs, "k2": _k2, "k3": _k3, "low_var_kl": _low_var_kl}


def kl_estimate(logp, ref_logp, kind, *, straight_through=False, mask=None):
  """Per-token estimate of KL(π_θ‖π_ref) from log-probs of tokens sampled from π_θ.

  Estimators k1, k2, k3 of Schulman (2020, "Approximating KL Divergence"; no arXiv id),
  see the module table. `low_var_kl` is k3 with its output clamped to [−10, 10] (verl).
  With `straight_through=True` the value is kX but the gradient is that of k2:
  k2 − sg(k2) + sg(kX) (verl's "kX+"), since ∇E[k2] is the gradient of the (reverse)
  KL to second order while k1 and k3 have biased gradients.

  Note: the input d of `k3`/`low_var_kl` is clamped to ±LOG_RATIO_CLAMP (= ±20) before
  e^{−d}, as in verl; tunix applies no clamp. k1, k2 and abs are not clamped.

  Args:
    logp: log-probs of the sampled tokens under the current policy, [B, T].
    ref_logp: the same under the reference policy, [B, T].
    kind: one of KL_ESTIMATORS ("k1", "k2", "k3", "low_var_kl", "abs").
    straight_through: value of `kind`, gradient of k2.
    mask: optional completion mask [B, T]. When given, the inputs at masked positions
      are replaced by 0 before any arithmetic and the output there is 0, so extreme
      values at padding can never reach a gradient. Without it, reduce the output with
      `aggregate`, which ignores masked positions in the forward pass.
  Returns:
    per-token KL estimate, float32 [B, T].
  """
  if kind not in KL_ESTIMATORS:
    raise ValueError(f"Unknown KL estimator {kind!r}; valid kinds: {tuple(KL_ESTIMATORS)}")
  chex.assert_equal_shape((logp, ref_logp))
  logp = logp.astype(jnp.float32)
  ref_logp = ref_logp.astype(jnp.float32)
  if mask is not None:
    chex.assert_equal_shape((logp, mask))
    logp = jnp.where(mask > 0, logp, 0.0)
    ref_logp = jnp.where(mask > 0, ref_logp, 0.0)
  d = logp - ref_logp
  kl = KL_ESTIMATORS[kind](d)
  if straight_through and kind != "k2":
    k2 = _k2(d)
    kl = k2 - jax.lax.stop_gradient(k2) + jax.lax.stop_gradient(kl)
  if mask is not None:
    kl = jnp.where(mask > 0, kl, 0.0)
  return kl


def is_corrected_kl(logp, old_logp, ref_logp, mask, *, kind="k3"):
  """Importance-corrected per-token KL: (π_θ/π_old)·kX(logπ_θ − logπ_ref).

  Tokens come from π_old, not π_θ, after the first update of a rollout (and from the
  sampler always), so E_{π_old}[kX] is not KL(π_θ‖π_ref); weighting by the ratio
  r = π_θ/π_old makes the estimate, and its gradient (r carries one), unbiased:
  E_{π_old}[r·k3] = KL(π_θ‖π_ref). DeepSeek-AI 2025, "DeepSeek-V3.2", arXiv:2512.02556
  (§ on the unbiased KL estimate, with k3); TRL `use_bias_correction_kl`.

  Note: r uses the clamped log-ratio of `rljax.ops.ratios.token_log_ratio` and is not
  truncated (TRL neither); with π_θ = π_old this equals `kl_estimate`.

  Args:
    logp, old_logp, ref_logp: current / old (sampling) / reference log-probs, [B, T].
    mask: completion mask, [B, T].
    kind: the estimator kX (see KL_ESTIMATORS; TRL and the paper use k3).
  Returns:
    per-token estimate, float32 [B, T]; 0 at masked positions.
  """
  ratio = jnp.exp(token_log_ratio(logp, old_logp, mask))
  return ratio * kl_estimate(logp, ref_logp, kind, mask=mask)


def _last_token_onehot(mask):
  """1 at the last position with mask > 0 in each row, 0 elsewhere (all 0 if empty)."""
  keep = mask > 0
  t = mask.shape[-1]
  last_b = t - 1 - jnp.argmax(keep[:, ::-1], axis=-1)
  has_any_b = jnp.any(keep, axis=-1)
  onehot = jnp.arange(t)[None, :] == last_b[:, None]
  return (onehot & has_any_b[:, None]).astype(jnp.float32)


def kl_penalized_rewards(scores_b, kl_bt, mask, *, beta):
  """Per-token rewards with a KL penalty: r_t = 1[t = last real token]·R − β·KL_t.

  The RLHF token-level reward (Ouyang et al. 2022, "Training language
  models to follow instructions with human feedback", arXiv:2203.02155, Eq. 2 written per
  token; Ziegler et al. 2019, arXiv:1909.08593, §2.2). The score R of the completion is
  put on its last real token (the EOS, or the last kept token of a truncated completion).

  Note: KL_t is whatever estimator the caller chose (Ouyang et al.'s Eq. 2 uses k1,
  log π_RL/π_SFT, of the policy against the SFT/reference model). The "last real token" is the last position
  whose mask is set. Rows with an empty mask get all-zero rewards.

  Args:
    scores_b: sequence scores R, [B].
    kl_bt: per-token KL estimates, [B, T].
    mask: completion mask, [B, T].
    beta: KL coefficient (float or scalar array, e.g. a controller's `.value`).
  Returns:
    rewards, float32 [B, T]; 0 at masked positions.
  """
  chex.assert_rank(scores_b, 1)
  chex.assert_equal_shape((kl_bt, mask))
  chex.assert_equal_shape_prefix((scores_b, mask), 1)
  keep = mask > 0
  kl_bt = jnp.where(keep, kl_bt.astype(jnp.float32), 0.0)
  scores_b = jnp.where(jnp.any(keep, axis=-1), scores_b.astype(jnp.float32), 0.0)
  rewards = _last_token_onehot(mask) * scores_b[:, None] - beta * kl_bt
  return jnp.where(keep, rewards, 0.0)


class AdaptiveKLController(NamedTuple):
  """Adaptive KL coefficient β (Ziegler et al. 2019, "Fine-Tuning Language Models from
  Human Preferences", arXiv:1909.08593, §2.2):

      e = clip(KL / target − 1, −0.2, 0.2),   β ← β · (1 + e · n_steps / horizon).

  A pure, jit-friendly state: `update` returns a new controller. Defaults are verl's
  (init β 0.001, target 0.1, horizon 10000; `verl/trainer/config/algorithm.py`).

  Note: the paper writes β ← β(1 + K_β e) with K_β = 0.1 per batch; the `n_steps/horizon`
  gain is the form of the authors' code (openai/lm-human-preferences), used by verl and
  OpenRLHF.
  """

  value: chex.Numeric = 0.001
  target: chex.Numeric = 0.1
  horizon: chex.Numeric = 10000.0

  def update(self, current_kl, n_steps):
    """New controller after observing `current_kl` over `n_steps` samples."""
    error = jnp.clip(current_kl / self.target - 1.0, -0.2, 0.2)
    return self._replace(value=self.value * (1.0 + error * n_steps / self.horizon))


class FixedKLController(NamedTuple):
  """Constant KL coefficient β with the same interface as `AdaptiveKLController`."""

  value: chex.Numeric = 0.001

  def update(self, current_kl, n_steps):
    """Returns the controller unchanged (β is fixed)."""
    del current_kl, n_steps
    return self
