"""Diagnostics: what a trick does to the token distribution, pass@k curves, plots.

Per iteration: `token_statistics` (entropy quantiles, entropy by advantage sign,
Cov(log π, A), clipped tokens by probability). Per batch and pair of loss variants:
`impact_report` (effective gradient weights, bucketed) with `format_impact_table` and
`plot_impact`. Evaluation: `pass_at_k_curve`, `avg_at_k`, `plot_pass_at_k`.
"""

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
    LossVariant,
    SequenceBuckets,
    as_variant,
    effective_weights,
    format_impact_table,
    impact_report,
    variant_from_config,
)

__all__ = [
    "ImpactReport", "LossVariant", "SequenceBuckets", "as_variant", "avg_at_k",
    "clip_breakdown", "clip_by_probability_bt", "correct_counts", "curve_from_record",
    "effective_weights", "entropy_summary", "format_impact_table", "impact_report",
    "impact_section", "logp_advantage_covariance", "pass_at_k_curve", "pass_at_k_metrics",
    "plot_ablation", "plot_curves", "plot_impact", "plot_pass_at_k", "token_statistics",
    "variant_from_config",
]
