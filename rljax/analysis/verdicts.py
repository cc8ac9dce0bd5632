"""Tests behind the ablation verdicts: an exact sign-flip permutation test over seeds, Holm's
step-down adjustment, and the verdict a cell reads (`better`, `worse`, `equivalent`,
`unresolved`).

The interval of `rljax.analysis.effects.paired_effect` is calibrated when the per-seed
effects are normal. The sign-flip test is exact when they are symmetric about the effect,
whatever their tails (Fisher 1935, "The Design of Experiments", §21; Good 2005,
"Permutation, Parametric and Bootstrap Tests of Hypotheses", §3.1): under H0 every seed's
difference is as likely to have either sign, so all 2^K sign patterns are equally likely.
A verdict on the primary family uses the larger of the two p-values (it holds if either
model holds) and Holm's adjustment over the family (Holm 1979, "A simple sequentially
rejective multiple test procedure", Scand. J. Statist. 6:65).

Note: the sign-flip test's smallest two-sided p is 2/2^K: 0.125 at 4 seeds, 0.0625 at 5,
0.031 at 6, 0.0020 at 10. Below 6 seeds it never rejects at 5 %, and Holm over m tests
needs 2/2^K < 0.05/m for the first one (8 seeds for 5 steps). No rule computed from K seeds
covers the mean effect when a rare failure mode may be absent from them (Bahadur & Savage
1956, Ann. Math. Statist. 27:1115); the sign-flip test protects against heavy tails, not
against a failure mode no seed showed.
"""

from __future__ import annotations

import functools
import math

import numpy as np

VERDICTS = ("better", "worse", "equivalent", "unresolved")
MAX_EXACT_SEEDS = 16        # beyond: 2^16 random sign patterns (the observed one included)


@functools.lru_cache(maxsize=32)
def _sign_patterns(k: int, rng_seed: int) -> np.ndarray:
  """Sign patterns, float [P, K] (read-only): all 2^K (K ≤ MAX_EXACT_SEEDS, the first all
  +1), else 2^16 random ones with the identity first."""
  if k <= MAX_EXACT_SEEDS:
    bits = (np.arange(2**k)[:, None] >> np.arange(k)[None, :]) & 1
    signs = 1.0 - 2.0 * bits
  else:
    signs = np.random.default_rng(rng_seed).choice([-1.0, 1.0], size=(2**MAX_EXACT_SEEDS, k))
    signs[0] = 1.0
  signs.flags.writeable = False
  return signs


def sign_flip_pvalue(d, *, theta=0.0, alternative="two-sided", rng_seed=0):
  """Exact sign-flip permutation p-value for the centre of the per-seed effects.

  Statistic S(s) = Σ_k s_k (d_k − θ) over sign patterns s ∈ {−1, +1}^K. Under H0 the
  d_k − θ are symmetric about 0 and independent, so the observed S(1) is one of 2^K equally
  likely values: p = #{s : S(s) ≥ S(1)} / 2^K (one-sided "greater"), ≤ ("less"), or
  |S(s)| ≥ |S(1)| (two-sided). Ties count as at least as extreme (a relative tolerance of
  1e-12 absorbs the floats' rounding).

  Args:
    d: per-seed differences, float [..., K] (leading axes: independent problems).
    theta: the hypothesised centre (0: no effect; ±margin: equivalence bounds).
    alternative: "two-sided", "greater" (H1: centre > θ) or "less".
    rng_seed: seed of the random patterns beyond MAX_EXACT_SEEDS seeds.
  Returns:
    p, float [...] (NaN where K = 0).
  """
  x = np.asarray(d, np.float64) - theta
  k = x.shape[-1]
  if k == 0:
    return np.full(x.shape[:-1], np.nan)[()]
  stats = x @ _sign_patterns(k, rng_seed).T                        # [..., P]
  observed = x.sum(axis=-1, keepdims=True)                         # [..., 1]
  tol = 1e-12 * np.abs(x).sum(axis=-1, keepdims=True)
  if alternative == "two-sided":
    extreme = np.abs(stats) >= np.abs(observed) - tol
  elif alternative == "greater":
    extreme = stats >= observed - tol
  elif alternative == "less":
    extreme = stats <= observed + tol
  else:
    raise ValueError(f"alternative must be 'two-sided', 'greater' or 'less', got {alternative!r}")
  return extreme.mean(axis=-1)[()]


def sign_flip_equivalence_pvalue(d, margin, *, rng_seed=0):
  """TOST (Schuirmann 1987, J. Pharmacokinet. Biopharm. 15:657) from two one-sided
  sign-flip tests: H0 centre ≤ −margin (vs greater) and H0 centre ≥ +margin (vs less);
  p = the larger. Args as `sign_flip_pvalue`; NaN without a finite margin > 0."""
  if margin is None or not math.isfinite(margin) or margin <= 0:
    return float("nan")
  return float(np.maximum(
      sign_flip_pvalue(d, theta=-margin, alternative="greater", rng_seed=rng_seed),
      sign_flip_pvalue(d, theta=margin, alternative="less", rng_seed=rng_seed)))


def holm(p):
  """Holm's step-down adjusted p-values (Holm 1979).

  With the m finite p-values sorted, p_(1) ≤ … ≤ p_(m):
  p̃_(i) = max_{j ≤ i} min(1, (m − j + 1)·p_(j)); rejecting where p̃ < α controls the
  family-wise error rate at α under any dependence between the tests.

  Args:
    p: p-values, float [m] (NaN: no test; stays NaN and does not count in m).
  Returns:
    adjusted p-values, float [m], in the input order.
  """
  p = np.asarray(p, np.float64)
  out = np.full(p.shape, np.nan)
  finite = np.flatnonzero(np.isfinite(p))
  m = finite.size
  order = finite[np.argsort(p[finite], kind="stable")]
  running = 0.0
  for i, idx in enumerate(order):
    running = max(running, min(1.0, (m - i) * p[idx]))
    out[idx] = running
  return out


def verdict(mean, p, p_equivalence, *, alpha=0.05, higher_is_better=True):
  """The cell's verdict from its (adjusted) p-values at level α.

  `better` / `worse`: p < α (the interval at level 1 − α excludes 0; the direction is the
  mean's, swapped when lower is better); `equivalent`: p_equivalence < α/2, i.e. both
  one-sided tests reject at α/2, so the 1 − α interval lies inside ± the margin (a TOST at
  level α/2, the interval the report prints); otherwise `unresolved`.

  Args:
    mean: the effect's estimate (B − A).
    p: p-value of "no effect" (NaN: untested).
    p_equivalence: TOST p-value of "|effect| ≥ margin" (NaN: no margin).
  Returns:
    one of `VERDICTS`.
  """
  if math.isfinite(p) and p < alpha and mean != 0:
    return "better" if (mean > 0) == higher_is_better else "worse"
  if math.isfinite(p_equivalence) and p_equivalence < alpha / 2:
    return "equivalent"
  return "unresolved"


def _exploratory(effect) -> dict:
  """An exploratory cell: the interval's own p's and verdict, unadjusted."""
  p, p_eq = effect["p_interval"], effect["p_equivalence_interval"]
  return {"family": "exploratory", "p": p, "p_adjusted": p, "p_equivalence": p_eq,
          "p_equivalence_adjusted": p_eq}


def assign_families(steps, primary_outcome, *, alpha=0.05) -> list:
  """Marks every effect of a report primary or exploratory and gives it its verdict.

  The primary family is one test per step: `primary_outcome` vs the previous step, for
  every step after the first that is not a repeat `STEP@LABEL` (an A/A control stays
  exploratory, unadjusted: the strictest check of false verdicts). A primary effect's `p`
  is the larger of its interval's and its sign-flip p (so it is valid if the seed effects
  are normal or if they are symmetric), its `p_equivalence` likewise, and both are
  Holm-adjusted over the family (`p_adjusted`, `p_equivalence_adjusted`); its verdict is
  `verdict` of the adjusted values. Every other effect is exploratory: `p` and
  `p_adjusted` are its interval's p and its verdict is the interval's.

  Args:
    steps: the report's steps (`effects_report`), changed in place: each effect dict gains
      "family", "p", "p_adjusted", "p_equivalence", "p_equivalence_adjusted" and a
      "verdict" for primary effects.
    primary_outcome: outcome name, or None (every effect exploratory).
    alpha: the family-wise level.
  Returns:
    the names of the steps in the primary family.
  """
  primary = []
  for step in steps:
    for key in ("effects_vs_previous", "effects_vs_first"):
      for outcome, effect in step[key].items():
        effect.update(_exploratory(effect))
        if (key == "effects_vs_previous" and outcome == primary_outcome
            and "@" not in step["name"]):
          primary.append((step["name"], effect))
  p = holm([max(e["p_interval"], e["p_sign_flip"]) for _, e in primary])
  p_eq = holm([max(e["p_equivalence_interval"], e["p_equivalence_sign_flip"])
               for _, e in primary])
  for (_, effect), p_adj, p_eq_adj in zip(primary, p, p_eq):
    effect.update(
        family="primary", p=max(effect["p_interval"], effect["p_sign_flip"]), p_adjusted=p_adj,
        p_equivalence=max(effect["p_equivalence_interval"], effect["p_equivalence_sign_flip"]),
        p_equivalence_adjusted=p_eq_adj,
        verdict=verdict(effect["mean"], p_adj, p_eq_adj, alpha=alpha,
                        higher_is_better=effect.get("higher_is_better", True)))
  return [name for name, _ in primary]
