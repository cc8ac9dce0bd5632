"""Ablation verdicts: the sign-flip test, Holm and TOST on hand-worked examples, coverage of
the combined rule (interval and sign-flip) under normal, heavy-tailed and rare-bad-seed seed
effects, the primary family's family-wise false-verdict rate on simulated null reports, and
the pairing check."""

import itertools
import math

import numpy as np
import pytest

from rljax.analysis import ablation_report, effects, verdicts

ALPHA = 0.05


def test_sign_flip_pvalue_by_hand_and_by_enumeration():
  # d = 1, 2, 3: the 8 sums ±1 ± 2 ± 3 are 6, 4, 2, 0, 0, −2, −4, −6; |S| ≥ 6 twice
  assert verdicts.sign_flip_pvalue([1.0, 2.0, 3.0]) == pytest.approx(2 / 8)
  assert verdicts.sign_flip_pvalue([1.0, 2.0, 3.0], alternative="greater") == pytest.approx(1 / 8)
  assert verdicts.sign_flip_pvalue([1.0, 2.0, 3.0], alternative="less") == pytest.approx(1.0)
  # θ = 2: d − θ = −1, 0, 1 sums to 0, and every pattern's |S| is ≥ 0: p = 1
  assert verdicts.sign_flip_pvalue([1.0, 2.0, 3.0], theta=2.0) == pytest.approx(1.0)
  rng = np.random.default_rng(0)
  d = rng.normal(0.3, 1.0, (5, 7))
  for row, p in zip(d, verdicts.sign_flip_pvalue(d)):       # vectorised over leading axes
    sums = [abs(sum(s * x for s, x in zip(signs, row)))
            for signs in itertools.product([1, -1], repeat=7)]
    assert p == pytest.approx(np.mean([s >= abs(row.sum()) - 1e-12 for s in sums]))
  # the smallest two-sided p is 2/2^K: all seeds on one side
  for k in (4, 5, 6, 10):
    assert verdicts.sign_flip_pvalue(np.arange(1.0, k + 1)) == pytest.approx(2 / 2**k)


def test_sign_flip_beyond_exact_seeds_is_a_random_subset_with_the_identity():
  d = np.linspace(0.5, 2.0, 20)                     # all positive: p ≈ 2/2^20 exactly
  p = verdicts.sign_flip_pvalue(d)
  assert 1 / 2**16 <= p <= 3 / 2**16                # the identity, maybe its negation
  with pytest.raises(ValueError, match="alternative"):
    verdicts.sign_flip_pvalue(d, alternative="both")


def test_holm_by_hand():
  # sorted: 0.005, 0.01, 0.03, 0.04 -> 4·0.005 = 0.02, 3·0.01 = 0.03, 2·0.03 = 0.06,
  # max(0.06, 1·0.04) = 0.06 (adjusted p's never decrease along the order)
  np.testing.assert_allclose(verdicts.holm([0.01, 0.04, 0.03, 0.005]),
                             [0.03, 0.06, 0.06, 0.02])
  # NaN is no test: m = 2
  np.testing.assert_allclose(verdicts.holm([0.01, np.nan, 0.04]), [0.02, np.nan, 0.04])
  np.testing.assert_allclose(verdicts.holm([0.6, 0.5]), [1.0, 1.0])
  assert verdicts.holm([]).size == 0


def test_tost_by_hand_on_three_seeds():
  """d = 1, 2, 3: mean 2, se 1/√3, t with 2 df, whose CDF is 1/2 + t/(2√(2 + t²)).
  Margin 4: p(θ ≥ 4) = F((2 − 4)·√3) = 1/2 − √(3/14) = 0.0371, p(θ ≤ −4) = 1/2 − √(27/110);
  TOST p = 0.0371, not below α/2: the 95 % interval 2 ± 4.303/√3 = [−0.48, 4.48] leaves ±4.
  Margin 5: p = F(−3√3) = 1/2 − 3√3/(2√29) = 0.0175 < α/2: equivalent ([−0.48, 4.48] ⊂ ±5)."""
  e4 = effects.paired_effect([1.0, 2.0, 3.0], [0.0] * 3, margin=4.0)
  assert e4.p_equivalence_interval == pytest.approx(0.5 - math.sqrt(3 / 14), rel=1e-9)
  assert e4.verdict == "unresolved"
  assert verdicts.verdict(e4.mean, e4.p_interval, e4.p_equivalence_interval) == "unresolved"
  e5 = effects.paired_effect([1.0, 2.0, 3.0], [0.0] * 3, margin=5.0)
  assert e5.p_equivalence_interval == pytest.approx(0.5 - 3 * math.sqrt(3) / (2 * math.sqrt(29)))
  assert e5.verdict == "equivalent" and e5.ci_high < 5.0
  assert verdicts.verdict(e5.mean, e5.p_interval, e5.p_equivalence_interval) == "equivalent"
  # the same by one-sided sign flips: d + 5 all > 0 and d − 5 all < 0, each p = 1/8
  assert e5.p_equivalence_sign_flip == pytest.approx(1 / 8)
  # p of "no effect": 2·F(−2√3) = 1 − 2√(3/14), the t-test's
  assert e5.p_interval == pytest.approx(1 - 2 * math.sqrt(3 / 14), rel=1e-9)
  assert e5.p_sign_flip == pytest.approx(2 / 8)


def test_interval_p_agrees_with_the_interval():
  """p_interval < α exactly when the interval excludes 0 (run-level and per prompt)."""
  rng = np.random.default_rng(3)
  for i in range(40):
    b = rng.normal(0.02 * (i % 4), 0.05, (6, 24))
    e = effects.paired_effect(b, np.zeros_like(b), n_boot=300, rng_seed=i)
    assert (e.p_interval < ALPHA) == (e.ci_low > 0 or e.ci_high < 0), (i, e)
    r = effects.paired_effect(b.mean(1), np.zeros(6))
    assert (r.p_interval < ALPHA) == (r.ci_low > 0 or r.ci_high < 0), (i, r)


def _seed_effects(setting, n_sets, k, rng):
  """Per-seed differences [S, K] and the true mean effect. `rare_bad_seed`: the issue's
  case, 20 % of seeds fail (their effect is 0, the others' 0.10 ± 0.01)."""
  if setting == "normal":
    return 0.05 + rng.normal(0.0, 0.05, (n_sets, k)), 0.05
  if setting == "heavy_tailed":
    return 0.05 + 0.05 * rng.standard_t(3, (n_sets, k)), 0.05
  bad = rng.random((n_sets, k)) < 0.2
  return np.where(bad, 0.0, 0.10) + rng.normal(0.0, 0.01, (n_sets, k)), 0.08


def _combined_covers(d, theta):
  """Does the combined rule keep θ (neither the interval nor the sign-flip test rejects it:
  the larger p ≥ α)? The functions the report uses, vectorised over simulations."""
  _, low, high, p_interval = effects.seed_t_interval(d - theta)
  p = np.maximum(p_interval, verdicts.sign_flip_pvalue(d, theta=theta))
  assert np.array_equal(p_interval >= ALPHA, (low <= 0) & (0 <= high))
  return p >= ALPHA, (low <= 0) & (0 <= high)


@pytest.mark.parametrize("setting", ["normal", "heavy_tailed", "rare_bad_seed"])
@pytest.mark.parametrize("k", [4, 6, 10])
def test_combined_rule_coverage(setting, k):
  """2000 simulated ablations per setting. The combined rule keeps θ whenever the sign-flip
  test does, so its coverage is at least the sign-flip test's: exactly 1 at 4 seeds (its
  smallest p is 2/16), at least 1 − 2/64 = 96.9 % at 6 for symmetric effects. Measured
  (20000 sets; t alone / combined): normal 95.1/100, 95.2/97.5, 95.1/95.4 % at 4/6/10 seeds;
  heavy-tailed (t_3) 96.3/100, 96.3/98.0, 96.0/96.2 %; rare bad seed 69/100, 74/77, 89/89 %.

  A rare bad seed cannot be covered by any rule computed from the seeds when none of them
  failed (Bahadur & Savage 1956): those samples (0.8^K of them) sit around 0.10, not the
  mean 0.08. The rule is then asserted where it can hold: on the samples that do contain a
  failed seed."""
  rng = np.random.default_rng(1000 + k)
  d, theta = _seed_effects(setting, 2000, k, rng)
  combined, t_alone = _combined_covers(d, theta)
  assert np.all(combined >= t_alone)                 # never less than today's interval
  if k == 4:
    assert combined.all()                            # no verdict is possible at 4 seeds
    return
  if setting == "rare_bad_seed":
    failed = (d < 0.05).any(axis=1)
    assert 0.92 <= combined[failed].mean() <= 1.0, combined[failed].mean()
    assert combined[~failed].mean() < 0.2            # the limit no rule passes
    return
  upper = 0.985 if k == 6 else 0.98                  # 6 seeds: ≥ 96.9 % by construction
  assert 0.92 <= combined.mean() <= upper, combined.mean()


def test_combined_rule_coverage_per_prompt():
  """The real per-prompt function at 6 seeds (500 sets, 32 prompts, seed and prompt spread
  and cell noise): the combined rule (`paired_effect`'s p_interval and p_sign_flip, tested
  at θ by shifting B) covers θ in 92-98.5 % of the sets."""
  rng = np.random.default_rng(7)
  k, n, theta, covered = 6, 32, 0.03, []
  for i in range(500):
    d = (theta + rng.normal(0.0, 0.03, (k, 1)) + rng.normal(0.0, 0.05, (1, n))
         + rng.normal(0.0, 0.2, (k, n)))
    e = effects.paired_effect(d - theta, np.zeros_like(d), n_boot=200, rng_seed=i)
    covered.append(max(e.p_interval, e.p_sign_flip) >= ALPHA)
  assert 0.92 <= np.mean(covered) <= 0.985, np.mean(covered)


def _null_report(rng, n_steps, k, n_prompts=24):
  """An ablation where no step does anything: every step's per-prompt outcome is the seed's
  level, the prompt's difficulty, the run's own seed × arm noise and cell noise."""
  u = rng.normal(0.0, 0.05, (k, 1))
  v = rng.normal(0.5, 0.2, (1, n_prompts))
  return {f"step{j}": [{"heldout_avg@8": row}
                       for row in u + v + rng.normal(0.0, 0.03, (k, 1))
                       + rng.normal(0.0, 0.15, (k, n_prompts))]
          for j in range(n_steps)}


def test_primary_family_false_verdicts_at_most_five_percent():
  """200 simulated null reports of 6 steps at 10 seeds (a primary family of 5 tests; at 6
  seeds the sign-flip floor 2/64 > 0.05/5 forbids any primary verdict): at most 5 % of them
  give any false better/worse primary verdict. The same cells read by today's rule (each
  interval alone) give one in at least 10 % of the reports."""
  k = 10
  rng = np.random.default_rng(k)
  any_false, any_false_unadjusted = 0, 0
  for _ in range(200):
    report = ablation_report.effects_report(_null_report(rng, 6, k, n_prompts=16), n_boot=60)
    family = [s["effects_vs_previous"]["heldout_avg@8"] for s in report["steps"][1:]]
    assert {e["family"] for e in family} == {"primary"}
    any_false += any(e["verdict"] in ("better", "worse") for e in family)
    any_false_unadjusted += any(e["p_interval"] < ALPHA for e in family)
  assert any_false / 200 <= 0.05, any_false
  assert any_false_unadjusted / 200 >= 0.10, any_false_unadjusted


def test_families_holm_and_a_a_control():
  """The primary family is the primary outcome vs the previous step, one per step, the
  A/A copy aside; its p is the larger of the two tests', Holm-adjusted; the rest is
  exploratory with p_adjusted = p (the interval's)."""
  rng = np.random.default_rng(11)
  results = _null_report(rng, 3, 10)
  results["step0@aa"] = _null_report(rng, 1, 10)["step0"]
  results["step1"] = [{**r, "heldout_avg@8": r["heldout_avg@8"] + 0.2} for r in results["step1"]]
  report = ablation_report.effects_report(results, n_boot=200)
  assert report["primary"]["steps"] == ["step1", "step2"]
  assert report["primary"]["outcome"] == "heldout_avg@8"
  one, two = (report["steps"][i]["effects_vs_previous"]["heldout_avg@8"] for i in (1, 2))
  for e in (one, two):
    assert e["family"] == "primary"
    assert e["p"] == max(e["p_interval"], e["p_sign_flip"])
  np.testing.assert_allclose([one["p_adjusted"], two["p_adjusted"]],
                             verdicts.holm([one["p"], two["p"]]))
  assert one["verdict"] == "better" and two["verdict"] == "worse"   # +0.2 then back
  aa = report["steps"][3]["effects_vs_previous"]["heldout_avg@8"]
  first = report["steps"][2]["effects_vs_first"]["heldout_avg@8"]
  for e in (aa, first):
    assert e["family"] == "exploratory" and e["p"] == e["p_adjusted"] == e["p_interval"]
  assert report["margins"]["heldout_avg@8"] == 0.03


def test_equivalence_verdict_needs_the_interval_inside_the_margin():
  """Exploratory cells read `equivalent` when the 95 % interval lies inside ± the margin,
  from the ablation file's margin (or the 3-point default)."""
  rng = np.random.default_rng(5)
  base = rng.normal(0.5, 0.1, (8, 64))
  results = {"a": [{"heldout_accuracy": r, "x": float(r.mean())} for r in base],
             "b": [{"heldout_accuracy": r + rng.normal(0.0, 0.01, 64), "x": float(r.mean())}
                   for r in base]}
  report = ablation_report.effects_report(results, n_boot=300, primary_outcome="x",
                                          margins={"x": 0.5})
  acc = report["steps"][1]["effects_vs_first"]["heldout_accuracy"]
  assert acc["margin"] == 0.03 and -0.03 < acc["ci_low"] and acc["ci_high"] < 0.03
  assert acc["verdict"] == "equivalent"
  x = report["steps"][1]["effects_vs_previous"]["x"]    # primary, margin 0.5, d = 0 exactly
  assert x["family"] == "primary" and x["verdict"] == "equivalent"
  with pytest.raises(ValueError, match="PRIMARY_OUTCOME"):
    ablation_report.effects_report(results, primary_outcome="heldout_avg@8")


def test_mis_paired_prompt_ids_stop_the_report():
  results = {s: [{"heldout_avg@8": np.full(4, 0.5)} for _ in range(3)] for s in ("a", "b")}
  ids = {s: [np.array([10, 11, 12, 13]) for _ in range(3)] for s in ("a", "b")}
  ablation_report.effects_report(results, prompt_ids=ids, seeds=[0, 1, 2])   # paired: fine
  ids["b"][2] = np.array([10, 11, 13, 12])
  with pytest.raises(ValueError, match=r"step 'b', seed 7: .*position 2"):
    ablation_report.effects_report(results, prompt_ids=ids, seeds=[5, 6, 7])
  ids["b"][2] = np.array([10, 11, 12])
  with pytest.raises(ValueError, match="sizes 3 and 4"):
    ablation_report.effects_report(results, prompt_ids=ids)
