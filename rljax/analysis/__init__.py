"""Diagnostics: what a trick does to the token distribution, pass@k curves, plots.

Per iteration: `token_statistics` (entropy quantiles, entropy by advantage sign,
Cov(log π, A), clipped tokens by probability). Per batch and pair of loss variants:
`impact_report` (effective gradient weights, bucketed) with `format_impact_table` and
`plot_impact`. Evaluation: `pass_at_k_curve`, `avg_at_k`, `plot_pass_at_k`. Ablations:
`paired_effect` (paired effect of one step over another, calibrated interval, p-values,
verdict), `detectable_effect`, `effects_report` (primary family Holm-adjusted, the rest
exploratory) with `effects_markdown` and `plot_effects`; the tests behind the verdicts
(`sign_flip_pvalue`, `holm`) are in `rljax.analysis.verdicts`.
"""

from rljax.analysis.ablation_report import effects_markdown, effects_report, plot_effects
from rljax.analysis.effects import (
    Effect,
    detectable_effect,
    iqm,
    paired_effect,
    pass_at_k_outcome,
)
from rljax.analysis.loss_weights import (
    LossVariant,
    as_variant,
    effective_weights,
    variant_from_config,
)
from rljax.analysis.passk import (
    avg_at_k,
    correct_counts,
    curve_from_record,
    pass_at_k_curve,
    pass_at_k_metrics,
)
from rljax.analysis.plots import plot_ablation, plot_curves, plot_impact, plot_pass_at_k
from rljax.analysis.report import impact_section
from rljax.analysis.token_stats import (
    clip_breakdown,
    clip_by_probability_bt,
    entropy_summary,
    logp_advantage_covariance,
    token_statistics,
)
from rljax.analysis.trick_impact import (
    ImpactReport,
    SequenceBuckets,
    format_impact_table,
    impact_report,
)

__all__ = [
    "Effect", "ImpactReport", "LossVariant", "SequenceBuckets", "as_variant", "avg_at_k",
    "clip_breakdown", "clip_by_probability_bt", "correct_counts", "curve_from_record",
    "detectable_effect", "effective_weights", "effects_markdown", "effects_report",
    "entropy_summary", "format_impact_table", "impact_report", "impact_section", "iqm",
    "logp_advantage_covariance", "paired_effect", "pass_at_k_curve", "pass_at_k_metrics",
    "pass_at_k_outcome", "plot_ablation", "plot_curves", "plot_effects", "plot_impact",
    "plot_pass_at_k", "token_statistics", "variant_from_config",
]
