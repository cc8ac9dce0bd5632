"""Pure functions on arrays: every RL trick of rljax as a kernel with its paper and equation.

Every public op is importable from here (`rljax.ops.policy_loss(...)`, as `rlax.*`), and
from its module (`rljax.ops.policy_loss.policy_loss`). The registries by name are
`POLICY_LOSSES` (config `algo.policy_loss`), `ADVANTAGE_ESTIMATORS` (`algo.advantage`),
`KL_ESTIMATORS` (`algo.kl_estimator`) and `AGGREGATION_MODES` (`algo.loss_agg`).

Two modules share their name with their main op, `policy_loss` and `aggregate`: the
module stays importable (`rljax.ops.policy_loss.cispo_loss`), and calling it calls the op
(`rljax.ops.policy_loss(logp, old_logp, advantages, mask)`).
"""

import sys
import types

from rljax.ops.advantages import (
  batch_std_advantages,
  group_advantages,
  group_mean_std,
  pass_at_k_advantages,
  reinforce_pp_advantages,
  reinforce_pp_baseline_advantages,
  remax_advantages,
  rloo_advantages,
  valid_mask,
  whiten,
)
from rljax.ops.advantages_group import (
  GDPO_WHITEN_OVER,
  GPG_ALPHA,
  PF_PPO_METHODS,
  gdpo_advantages,
  gpg_advantages,
  grpo_passk_advantages,
  opo_advantages,
  optimal_token_baseline_advantages,
  pf_ppo_resample,
  pf_ppo_weights,
)
from rljax.ops.aggregate import (
  AGGREGATION_MODES,
  aggregate_parts,
)
from rljax.ops.distill import (
  distill_advantages,
  distill_reverse_kl,
)
from rljax.ops.entropy import (
  AdaptiveEntropyCoef,
  chunked_entropy,
  entropy_bonus,
  entropy_from_logits,
)
from rljax.ops.estimators import (
  ADVANTAGE_ESTIMATORS,
  AdvantageEstimator,
  GroupInputs,
  estimator_fields,
  estimator_kwargs,
  sequence_advantages,
)
from rljax.ops.kl import (
  KL_ESTIMATORS,
  LOW_VAR_KL_CLAMP,
  AdaptiveKLController,
  FixedKLController,
  is_corrected_kl,
  kl_estimate,
  kl_penalized_rewards,
)
from rljax.ops.masks import (
  PSR_NSR_PRESETS,
  high_entropy_mask,
  overlong_filter_mask,
  psr_nsr_weights,
)
from rljax.ops.mismatch import (
  MismatchDiagnostics,
  icepop_weights,
  mismatch_diagnostics,
  mismatch_log_ratio,
  off_policy_sequence_mask,
  sequence_mask,
  truncated_is_weights,
)
from rljax.ops.moe_routing import (
  LoadBalanceStats,
  expert_counts,
  expert_load_max,
  router_z_loss,
  routing_flip_rate,
  routing_flips,
  switch_load_balancing_loss,
)
from rljax.ops.off_policy import (
  BEHAV_CAP_MODES,
  DecoupledPPODiagnostics,
  StalenessMetrics,
  behaviour_weights,
  decoupled_ppo_loss,
  staleness_metrics,
)
from rljax.ops.policy_loss import (
  CISPO_CONVENTIONS,
  POLICY_LOSSES,
  RATIO_LEVELS,
  PolicyLossSpec,
  apply_policy_loss,
  cispo_loss,
  clip_cov_loss,
  get_policy_loss,
  policy_loss_fields,
  policy_loss_spec,
  reinforce_loss,
)
from rljax.ops.policy_loss_common import (
  PolicyLoss,
  PolicyLossDiagnostics,
  advantages_bt,
  clip_by_probability_bt,
  diagnostics,
  non_negative,
  positive,
)
from rljax.ops.policy_loss_cov import clip_cov_mask, kl_cov_loss, token_covariance
from rljax.ops.policy_loss_gated import (
  DPPO_DIVERGENCES,
  binary_kl,
  dppo_loss,
  dro_loss,
  gpg_loss,
  sapo_loss,
)
from rljax.ops.policy_loss_sequence import gmpo_loss, luspo_loss, vespo_loss, vespo_weights
from rljax.ops.ratios import (
  gspo_token_log_ratio,
  sequence_log_ratio,
  token_log_ratio,
)
from rljax.ops.returns import discounted_returns, gae
from rljax.ops.shaping import (
  RunningMoments,
  clip_rewards,
  length_penalty,
  missing_eos_penalty,
  ngram_repetition_penalty,
  normalize_rewards,
  soft_overlong_penalty,
  whiten_rewards,
)
from rljax.ops.stats import (
  comb_ratio,
  masked_count,
  masked_mean,
  masked_std,
  masked_sum,
  masked_var,
  pass_at_k,
  pass_at_k_from_correct,
  safe_divide,
)
from rljax.ops.value import (
  ValueLossDiagnostics,
  explained_variance,
  value_loss,
)


def _callable_module(name: str, op) -> None:
  """Makes the module `rljax.ops.<name>` callable as its op of the same name."""

  class CallableModule(types.ModuleType):
    def __call__(self, *args, **kwargs):
      return op(*args, **kwargs)

  CallableModule.__call__.__doc__ = op.__doc__
  sys.modules[f"{__name__}.{name}"].__class__ = CallableModule


from rljax.ops import aggregate as _aggregate_module  # noqa: E402
from rljax.ops import policy_loss as _policy_loss_module  # noqa: E402

_callable_module("aggregate", _aggregate_module.aggregate)
_callable_module("policy_loss", _policy_loss_module.policy_loss)

# Every public op, sorted (the names imported above; `aggregate` and `policy_loss` are the
# callable modules).
__all__ = [
    "ADVANTAGE_ESTIMATORS", "AGGREGATION_MODES", "AdaptiveEntropyCoef", "AdaptiveKLController",
    "AdvantageEstimator", "BEHAV_CAP_MODES", "CISPO_CONVENTIONS", "DPPO_DIVERGENCES",
    "DecoupledPPODiagnostics", "FixedKLController", "GDPO_WHITEN_OVER", "GPG_ALPHA", "GroupInputs",
    "KL_ESTIMATORS", "LOW_VAR_KL_CLAMP", "LoadBalanceStats", "MismatchDiagnostics",
    "PF_PPO_METHODS", "POLICY_LOSSES", "PSR_NSR_PRESETS", "PolicyLoss", "PolicyLossDiagnostics",
    "PolicyLossSpec", "RATIO_LEVELS", "RunningMoments", "StalenessMetrics", "ValueLossDiagnostics",
    "advantages_bt", "aggregate", "aggregate_parts", "apply_policy_loss", "batch_std_advantages",
    "behaviour_weights", "binary_kl", "chunked_entropy", "cispo_loss", "clip_by_probability_bt",
    "clip_cov_loss", "clip_cov_mask", "clip_rewards", "comb_ratio", "decoupled_ppo_loss",
    "diagnostics", "discounted_returns", "distill_advantages", "distill_reverse_kl", "dppo_loss",
    "dro_loss", "entropy_bonus", "entropy_from_logits", "estimator_fields", "estimator_kwargs",
    "expert_counts", "expert_load_max", "explained_variance", "gae", "gdpo_advantages",
    "get_policy_loss", "gmpo_loss", "gpg_advantages", "gpg_loss", "group_advantages",
    "group_mean_std", "grpo_passk_advantages", "gspo_token_log_ratio", "high_entropy_mask",
    "icepop_weights", "is_corrected_kl", "kl_cov_loss", "kl_estimate", "kl_penalized_rewards",
    "length_penalty", "luspo_loss", "masked_count", "masked_mean", "masked_std", "masked_sum",
    "masked_var", "mismatch_diagnostics", "mismatch_log_ratio", "missing_eos_penalty",
    "ngram_repetition_penalty", "non_negative", "normalize_rewards", "off_policy_sequence_mask",
    "opo_advantages", "optimal_token_baseline_advantages", "overlong_filter_mask", "pass_at_k",
    "pass_at_k_advantages", "pass_at_k_from_correct", "pf_ppo_resample", "pf_ppo_weights",
    "policy_loss", "policy_loss_fields", "policy_loss_spec", "positive", "psr_nsr_weights",
    "reinforce_loss", "reinforce_pp_advantages", "reinforce_pp_baseline_advantages",
    "remax_advantages", "rloo_advantages", "router_z_loss", "routing_flip_rate", "routing_flips",
    "safe_divide", "sapo_loss", "sequence_advantages", "sequence_log_ratio", "sequence_mask",
    "soft_overlong_penalty", "staleness_metrics", "switch_load_balancing_loss", "token_covariance",
    "token_log_ratio", "truncated_is_weights", "valid_mask", "value_loss", "vespo_loss",
    "vespo_weights", "whiten", "whiten_rewards"
]
