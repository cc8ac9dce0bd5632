"""Statistics over a handful of seeds: the interquartile mean, the Student t interval of a
mean difference, and the smallest effect a paired t-test can detect (power analysis).
`rljax.analysis.effects.paired_effect` reads its intervals and `detectable` from these."""

from __future__ import annotations

import functools
import math

import numpy as np
from scipy import optimize, special


def iqm(x):
  """Interquartile mean: the mean of the middle 50 % (rliable, arXiv:2108.13264, §4).

  What `scipy.stats.trim_mean(x, 0.25)` computes (rliable's `aggregate_iqm` calls it): it
  cuts ⌊K/4⌋ values from each end, so with K < 4 seeds the IQM is the plain mean.

  Args:
    x: values, float [K].
  Returns:
    float.
  """
  x = np.sort(np.asarray(x, np.float64))
  cut = int(0.25 * x.size)
  return float(x[cut:x.size - cut].mean())


def seed_t_interval(d, *, confidence=0.95):
  """Student t interval and two-sided p of the mean of per-seed differences, vectorised.

  d̄ ± t_{1−α/2, K−1}·s/√K and p = 2·F_{t,K−1}(−|d̄|/(s/√K)) (s the ddof-1 sd), the
  run-level interval of `paired_effect`. When every seed moved by the same amount (s = 0)
  the interval is the point d̄ and p is 0 (or 1 when d̄ = 0).

  Args:
    d: per-seed differences, float [..., K], K ≥ 2 (leading axes: independent problems).
    confidence: interval level.
  Returns:
    (mean, low, high, p), each float [...].
  """
  d = np.asarray(d, np.float64)
  k = d.shape[-1]
  mean = d.mean(axis=-1)
  se = d.std(axis=-1, ddof=1) / math.sqrt(k)
  half = special.stdtrit(k - 1, 0.5 + confidence / 2) * se
  with np.errstate(divide="ignore", invalid="ignore"):
    p = np.where(se > 0, 2.0 * special.stdtr(k - 1, -np.abs(mean) / se),
                 np.where(mean == 0, 1.0, 0.0))
  return mean, mean - half, mean + half, p


def detectable_effect(se, df, *, alpha=0.05, power=0.8):
  """Smallest |effect| a two-sided t-test at level α detects with the given power.

  Solves P(|T'| > t_{1−α/2, ν}) = power for δ, where T' ~ noncentral t(ν, δ/se) is the
  t statistic of a paired test whose estimate has standard error `se` on ν = `df` degrees
  of freedom (the usual power equation for a one-sample / paired t-test). For large ν,
  δ ≈ (z_{1−α/2} + z_{power})·se = 2.80·se at α = 0.05, power 0.8.

  Args:
    se: standard error of the effect estimate (outcome units), ≥ 0.
    df: degrees of freedom, > 0 (need not be an integer).
    alpha: two-sided test level.
    power: required power, in (alpha, 1).
  Returns:
    δ in outcome units (0 when se = 0, NaN when se or df is not finite or df ≤ 0).
  """
  if not (math.isfinite(se) and math.isfinite(df)) or df <= 0:
    return float("nan")
  if se == 0:
    return 0.0
  return float(se * _detectable_in_se(float(df), float(alpha), float(power)))


@functools.lru_cache(maxsize=256)
def _detectable_in_se(df, alpha, power):
  """δ/se of `detectable_effect` (it depends on df, α and the power only)."""
  t_crit = special.stdtrit(df, 1.0 - alpha / 2.0)

  def shortfall(nc):   # special.nctdtr(ν, nc, t) is the noncentral t CDF (scipy.stats.nct)
    wrong_tail = np.nan_to_num(special.nctdtr(df, nc, -t_crit))  # NaN where it underflows
    return 1.0 - special.nctdtr(df, nc, t_crit) + wrong_tail - power

  high = 2.0 * (t_crit + special.stdtrit(df, power)) + 1.0
  while shortfall(high) < 0:
    high *= 2.0
  return optimize.brentq(shortfall, 0.0, high, xtol=1e-10)
