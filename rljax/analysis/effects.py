"""Paired effects between ablation steps, with intervals calibrated at 3-10 seeds.

The arms of one seed share the SFT start, the prompt order and the sampling keys (common
random numbers), so arm B is compared with arm A seed by seed and prompt by prompt:
d[k, n] = outcome_B[k, n] − outcome_A[k, n]. `paired_effect` turns d into a mean, a
confidence interval, p-values (the interval's, an exact sign-flip test over seeds, TOST
for equivalence), the IQM over seeds and a verdict; `detectable_effect` gives the
smallest effect the design can see (the ablation report built from them:
`rljax.analysis.ablation_report`; the seed-level statistics, `detectable_effect` among them,
are in `rljax.analysis.seed_stats`). NumPy and SciPy (`pass_at_k_outcome` calls
`rljax.ops.stats.pass_at_k`).

References: Miller 2024, "Adding Error Bars to Evals: A Statistical Approach to Language
Model Evaluations", arXiv:2411.00640 (paired differences, clustered standard errors);
Agarwal et al. 2021, "Deep Reinforcement Learning at the Edge of the Statistical
Precipice", arXiv:2108.13264 (IQM, stratified bootstrap over runs).
"""

from __future__ import annotations

import math
import re
from typing import NamedTuple

import numpy as np
from scipy import optimize, special, stats

from rljax.analysis.seed_stats import detectable_effect, iqm, seed_t_interval
from rljax.analysis.verdicts import VERDICTS, sign_flip_equivalence_pvalue, sign_flip_pvalue
from rljax.ops.stats import pass_at_k

__all__ = ["VERDICTS", "Effect", "detectable_effect", "iqm", "paired_effect",
           "pass_at_k_outcome", "seed_t_interval", "verdict"]


# Outcome names shown in percentage points by default (fractions in [0, 1]).
PERCENT_OUTCOMES = re.compile(r"acc|avg@\d+|pass@\d+|frac|rate")


class Effect(NamedTuple):
  """Paired effect of arm B over arm A (B − A) on one outcome; all values in outcome units."""
  mean: float         # mean of d over seeds (and prompts)
  ci_low: float       # confidence interval for the mean effect (NaN with fewer than 2 seeds)
  ci_high: float
  half_width: float   # (ci_high − ci_low) / 2
  verdict: str        # this interval alone: "better" / "worse" (excludes 0), "equivalent"
                      # (inside ± margin), "unresolved" (`rljax.analysis.verdicts`)
  iqm: float          # interquartile mean over seeds of the per-seed mean differences
  se: float           # standard error of `mean`
  df: float           # degrees of freedom of `se` (K − 1, or Satterthwaite with prompts)
  detectable: float   # smallest |effect| found with 80 % power at α = 0.05 (two-sided)
  n_seeds: int        # K seeds used (pairs with a non-finite value are dropped)
  n_prompts: int      # N prompts used; 0 for a run-level outcome
  p_interval: float   # two-sided p of "no effect" from the interval's law (< α iff it excludes 0)
  p_sign_flip: float  # two-sided exact sign-flip p over the per-seed mean differences
  margin: float       # smallest effect of interest (NaN: none, no equivalence test)
  p_equivalence_interval: float    # TOST p of "|effect| ≥ margin" from the interval's law
  p_equivalence_sign_flip: float   # the same from one-sided sign-flip tests

  def to_dict(self):
    """Plain-Python dict (floats, ints, str) for report.json."""
    return {key: (value if isinstance(value, (str, int)) else float(value))
            for key, value in self._asdict().items()}


def verdict(ci_low, ci_high, *, higher_is_better=True, margin=None):
  """The verdict an interval reads by itself: 'better' if it lies above 0, 'worse' if
  below, 'equivalent' if it lies inside (−margin, +margin), else 'unresolved'.

  With `higher_is_better=False` (truncation rate, wall time) 'better' and 'worse' swap.
  """
  if not (math.isfinite(ci_low) and math.isfinite(ci_high)):
    return "unresolved"
  if ci_low > 0.0 or ci_high < 0.0:
    return "better" if (ci_low > 0.0) == higher_is_better else "worse"
  if margin is not None and math.isfinite(margin) and -margin < ci_low and ci_high < margin:
    return "equivalent"
  return "unresolved"


def _step(x_is_above):
  """The law of a degenerate d̄ − θ (every seed and prompt moved alike): a step at 0."""
  return lambda x: 1.0 if x_is_above(x) else 0.0


def _tests(grand, cdf, sf, seed_means, margin):
  """(p_interval, p_sign_flip, p_equivalence_interval, p_equivalence_sign_flip).

  `cdf(x)` = P(d̄ − θ ≤ x), `sf(x)` = P(d̄ − θ ≥ x) under the interval's law. Two-sided
  p = 2·min(cdf(d̄), sf(d̄)), so p < α exactly when the equal-tailed 1 − α interval excludes
  0; TOST: max(sf(d̄ + δ), cdf(d̄ − δ)), the one-sided p's of θ ≤ −δ and θ ≥ +δ."""
  p = min(1.0, 2.0 * min(cdf(grand), sf(grand)))
  has_margin = margin is not None and math.isfinite(margin) and margin > 0
  p_eq = max(sf(grand + margin), cdf(grand - margin)) if has_margin else math.nan
  return (p, float(sign_flip_pvalue(seed_means)), p_eq,
          sign_flip_equivalence_pvalue(seed_means, margin))


def _no_interval(mean, k, n, margin):
  nan = math.nan
  return Effect(mean, nan, nan, nan, "unresolved", mean, nan, nan, nan, k, n, nan, nan,
                nan if margin is None else float(margin), nan, nan)


def _run_level(d_k, *, confidence, higher_is_better, margin):
  """t-interval over seeds of the per-seed differences d_k, float [K]."""
  k = d_k.size
  mean = float(d_k.mean()) if k else float("nan")
  if k < 2:
    return _no_interval(mean, k, 0, margin)
  se = float(d_k.std(ddof=1) / math.sqrt(k))
  _, low, high, _ = map(float, seed_t_interval(d_k, confidence=confidence))
  if se == 0.0:  # every seed moved by exactly the same amount
    cdf, sf = _step(lambda x: x >= 0), _step(lambda x: x <= 0)
  else:
    cdf = lambda x: float(special.stdtr(k - 1, x / se))    # noqa: E731
    sf = lambda x: float(special.stdtr(k - 1, -x / se))    # noqa: E731
  p, p_sf, p_eq, p_eq_sf = _tests(mean, cdf, sf, d_k, margin)
  return Effect(mean, low, high, (high - low) / 2,
                verdict(low, high, higher_is_better=higher_is_better, margin=margin),
                iqm(d_k), se, float(k - 1), detectable_effect(se, k - 1, alpha=1.0 - confidence),
                k, 0, p, p_sf, math.nan if margin is None else float(margin), p_eq, p_eq_sf)


def _prompt_variance(d_kn, seed_means, prompt_means, grand):
  """(σ̂_p², Var_n of the prompt means): the prompt × arm variance with the cell noise
  already counted in the seed part removed (see `paired_effect`)."""
  k, n = d_kn.shape
  resid = d_kn - seed_means[:, None] - prompt_means[None, :] + grand
  ms_resid = np.sum(resid**2) / ((k - 1) * (n - 1))   # estimates σ_e²
  var_prompt_means = prompt_means.var(ddof=1)         # estimates σ_p² + σ_e²/K
  return max(var_prompt_means - ms_resid / k, 0.0), var_prompt_means


def _prompt_level(d_kn, *, confidence, n_boot, rng_seed, higher_is_better, margin):
  """t over seeds convolved with a bootstrap over prompts (see `paired_effect`)."""
  k, n = d_kn.shape
  seed_means = d_kn.mean(axis=1)                      # [K]
  prompt_means = d_kn.mean(axis=0)                    # [N]
  grand = float(d_kn.mean())
  if k < 2 or n < 2:
    effect = _run_level(seed_means, confidence=confidence, higher_is_better=higher_is_better,
                        margin=margin)
    return effect._replace(mean=grand, n_prompts=n)
  var_seed = seed_means.var(ddof=1) / k               # estimates σ_s²/K + σ_e²/(KN)
  var_p, var_prompt_means = _prompt_variance(d_kn, seed_means, prompt_means, grand)
  # Prompt effects rescaled to variance σ_p² (and by N/(N−1), so that the bootstrap variance
  # of their mean is σ_p²/N, not (N−1)/N of it), then resampled.
  scale = math.sqrt(var_p / var_prompt_means * n / (n - 1)) if var_prompt_means > 0 else 0.0
  effects_n = (prompt_means - grand) * scale
  rng = np.random.default_rng(rng_seed)
  boot = effects_n[rng.integers(0, n, size=(n_boot, n))].mean(axis=1)   # [n_boot]
  s = math.sqrt(var_seed)
  alpha = 1.0 - confidence
  if s == 0.0 and not np.any(boot):
    low = high = grand
    cdf, sf = _step(lambda x: x >= 0), _step(lambda x: x <= 0)
  else:
    s = max(s, 1e-12 * (abs(grand) + float(np.abs(boot).max()) + 1e-300))
    cdf = lambda x: float(np.mean(special.stdtr(k - 1, (x - boot) / s)))    # noqa: E731
    sf = lambda x: float(np.mean(special.stdtr(k - 1, (boot - x) / s)))     # noqa: E731
    t_out, t_in = stats.t.ppf(alpha / 4, k - 1), stats.t.ppf(alpha, k - 1)
    q_low = optimize.brentq(lambda x: cdf(x) - alpha / 2, boot.min() + s * t_out,
                            boot.max() + s * t_in, xtol=1e-12 * (1.0 + s))
    q_high = optimize.brentq(lambda x: cdf(x) - (1.0 - alpha / 2), boot.min() - s * t_in,
                             boot.max() - s * t_out, xtol=1e-12 * (1.0 + s))
    low, high = grand - q_high, grand - q_low   # basic interval: θ = d̄ − (d̄ − θ)
  var_prompt = var_p / n
  se = math.sqrt(var_seed + var_prompt)
  df = (var_seed + var_prompt) ** 2 / (var_seed**2 / (k - 1) + var_prompt**2 / (n - 1)) \
      if se > 0 else float(k - 1)
  p, p_sf, p_eq, p_eq_sf = _tests(grand, cdf, sf, seed_means, margin)
  return Effect(grand, float(low), float(high), float(high - low) / 2,
                verdict(low, high, higher_is_better=higher_is_better, margin=margin),
                iqm(seed_means), se, float(df), detectable_effect(se, df, alpha=alpha), k, n,
                p, p_sf, math.nan if margin is None else float(margin), p_eq, p_eq_sf)


def paired_effect(outcome_b, outcome_a, *, confidence=0.95, n_boot=2000, rng_seed=0,
                  higher_is_better=True, margin=None):
  """Effect of arm B over arm A, paired by seed (and prompt), with a calibrated interval.

  d[k, n] = outcome_B[k, n] − outcome_A[k, n]; the effect is θ = E[d], estimated by d̄.

  Run-level outcome ([K]: area under the train-reward curve, final entropy, upper clip
  fraction): the Student t interval over seeds, d̄ ± t_{1−α/2, K−1}·s_d/√K
  (`scipy.stats.ttest_1samp(...).confidence_interval`).

  Per-prompt outcome ([K, N]: avg@8 per prompt, 0/1 greedy correctness, pass@k): the
  prompts are the same held-out set under every seed, so d follows the crossed model
      d[k, n] = θ + s_k + p_n + e_kn,
  seed effect s_k (σ_s), prompt effect p_n (σ_p: prompt × arm interaction), cell noise e_kn
  (σ_e), and Var(d̄) = σ_s²/K + σ_p²/N + σ_e²/(KN). The error splits into two independent
  parts, d̄ − θ = (s̄ + ē) + p̄, and each level gets its own calibrated pivot:
  - seed level, t-based: the per-seed means m_k = θ + p̄ + s_k + ē_k share p̄, so
    (m̄ − θ − p̄)/(s_m/√K) ~ t_{K−1} (exact for normal m_k), s_m the ddof-1 sd of the m_k;
  - prompt level, bootstrapped: p̄ is drawn by resampling N prompts with replacement from
    the prompt effects p̂_n = mean_k d[k, n] − d̄, rescaled to have variance
    σ̂_p² = max(Var_n p̂_n − MS_e/K, 0) (MS_e the two-way residual mean square), because
    Var p̂_n = σ_p² + σ_e²/K and the σ_e²/K part is already in s_m (the rescaled-residual
    bootstrap of Carpenter, Goldstein & Rasbash 2003, Appl. Statist. 52:431).
  The distribution of d̄ − θ is the t_{K−1}·s_m/√K law convolved with the bootstrap law of
  p̄*: G(x) = mean_b F_{t,K−1}((x − p̄*_b)/(s_m/√K)), inverted exactly (no Monte Carlo
  noise from the t part), and the interval is [d̄ − G⁻¹(1−α/2), d̄ − G⁻¹(α/2)].

  Note: the plain two-level bootstrap (resample seeds with replacement, then prompts within
  each resampled seed, read percentiles), the resampling analogue of Miller 2024's clustered
  standard errors (arXiv:2411.00640) and of rliable's stratified bootstrap over runs
  (arXiv:2108.13264), under-covers at K = 3..10: its variance over seeds is (K−1)/K of the
  truth and its tails are normal, not t_{K−1}, which matters most at K = 3 (t_{0.975,2} =
  4.30 vs 1.96). Resampling prompts independently within each seed also treats the crossed
  design as nested, which counts σ_p²/N as σ_p²/(KN) and σ_e²/(KN) twice (on crossed
  designs see Owen 2007, "The pigeonhole bootstrap", Ann. Appl. Stat. 1:386). On 1000
  simulated data sets per cell (N = 128; seed-dominated, prompt-dominated and mixed spread;
  K = 3, 6, 10) the nested percentile bootstrap covered 75-96 % (75 % at K = 3 when the
  seed spread dominates), this interval 93.5-97.6 % (tests/test_analysis_effects.py checks
  500 data sets at K = 3 and 6); with bounded outcomes (avg@8 from 8 Bernoulli draws, 0/1
  greedy correctness) it covered 93.9-96.8 %. The price of the t_{K−1} seed part is width
  at K = 3 (t_{0.975,2}/z_{0.975} = 2.2). Prompts are treated as a sample from a larger pool
  (Miller's super-population view), so θ is the effect on new prompts, not only on this
  held-out set. `se`/`df` (for `detectable`) use the Satterthwaite (1946) degrees of
  freedom of s_m²/K + σ̂_p²/N.

  Tests beside the interval (`rljax.analysis.verdicts`): `p_interval` is the two-sided p of
  θ = 0 under the interval's law G (p < α exactly when the interval excludes 0);
  `p_sign_flip` the exact sign-flip permutation p over the per-seed mean differences m_k,
  valid whenever the m_k are symmetric about their centre, whatever their tails (for a
  per-prompt outcome it conditions on the held-out prompts: the prompt part is the
  interval's); with a `margin` δ, `p_equivalence_*` are the TOST p's of |θ| ≥ δ from G and
  from one-sided sign-flip tests.

  Args:
    outcome_b, outcome_a: float [K] (run-level) or [K, N] (per prompt), paired by index.
      Seeds (rows) or prompts (columns) with a non-finite value in either arm are dropped.
    confidence: interval level.
    n_boot: prompt resamples (per-prompt outcomes only).
    rng_seed: seed of the prompt resampling (results are reproducible).
    higher_is_better: False swaps the "better" / "worse" labels.
    margin: smallest effect of interest δ > 0 in outcome units (None: no equivalence test).
  Returns:
    `Effect` (floats in outcome units); its verdict is the interval's alone (better / worse /
    equivalent / unresolved). With fewer than 2 seeds the interval, se, df, detectable and
    p's are NaN and the verdict is "unresolved".
  """
  b = np.asarray(outcome_b, np.float64)
  a = np.asarray(outcome_a, np.float64)
  if b.shape != a.shape or b.ndim not in (1, 2):
    raise ValueError(f"paired_effect needs two [K] or two [K, N] arrays, got {b.shape} and "
                     f"{a.shape}")
  if not 0.0 < confidence < 1.0:
    raise ValueError(f"confidence must be in (0, 1), got {confidence}")
  d = b - a
  finite = np.isfinite(d)
  if margin is not None and not (math.isfinite(margin) and margin > 0):
    raise ValueError(f"margin must be a positive number or None, got {margin}")
  if d.ndim == 1:
    return _run_level(d[finite], confidence=confidence, higher_is_better=higher_is_better,
                      margin=margin)
  return _prompt_level(d[:, finite.all(axis=0)], confidence=confidence, n_boot=int(n_boot),
                       rng_seed=rng_seed, higher_is_better=higher_is_better, margin=margin)


def pass_at_k_outcome(correct_counts, n, k):
  """Unbiased pass@k per prompt as a float64 outcome array (for `paired_effect`).

  Calls `rljax.ops.stats.pass_at_k` (Chen et al. 2021, arXiv:2107.03374, Eq. 1).

  Args:
    correct_counts: correct samples per prompt c, int [K, N] (or any shape), 0 ≤ c ≤ n.
    n: samples per prompt, int or int array broadcastable with c.
    k: 1 ≤ k ≤ n.
  Returns:
    pass@k, float64, shape of correct_counts.
  """

  return np.asarray(pass_at_k(n, np.asarray(correct_counts), k), np.float64)


