"""Paired ablation effects: interval coverage on simulated ablations, golden values, verdicts,
detectable effects, the report's schema, its Markdown table and forest plot."""

import json
import math
import re

import numpy as np
import pytest

from rljax.analysis import ablation_report, effects

T_975_DF2 = 4.302652729911275   # Student t quantile t_{0.975, 2} (printed tables: 4.303)
Z_975, Z_80 = 1.959963984540054, 0.8416212335729143


def _simulate(n_sets, k, n, *, theta, sd_seed, sd_prompt, sd_cell, rng):
  """Arms A, B [S, K, N] under the crossed model: a shared seed level u_k and prompt
  difficulty v_n (cancel in B − A), plus B's own seed effect s_k, prompt effect p_n
  (prompt × arm interaction) and per-cell noise in both arms."""
  u = rng.normal(0.0, 0.05, (n_sets, k, 1))
  v = rng.normal(0.5, 0.2, (n_sets, 1, n))
  arm_a = u + v + rng.normal(0.0, sd_cell / math.sqrt(2), (n_sets, k, n))
  arm_b = (u + v + theta + rng.normal(0.0, sd_seed, (n_sets, k, 1))
           + rng.normal(0.0, sd_prompt, (n_sets, 1, n))
           + rng.normal(0.0, sd_cell / math.sqrt(2), (n_sets, k, n)))
  return arm_b, arm_a


# (K, σ_seed, σ_prompt): the two variance sources each dominate once at K = 6. With N = 128
# and σ_cell = 0.3 the three variance terms σ_s²/K, σ_p²/N, σ_e²/(KN) are all comparable in
# the mixed case. Measured coverage with these numbers (500 sets, 200 prompt resamples
# each): 96.2 % (K = 3, mixed), 95.4 % / 96.6 % (K = 6, seed- / prompt-dominated).
@pytest.mark.parametrize("k,sd_seed,sd_prompt", [(3, 0.02, 0.1), (6, 0.03, 0.0),
                                                 (6, 0.0, 0.15)])
def test_interval_covers_true_effect(k, sd_seed, sd_prompt):
  rng = np.random.default_rng(k * 100 + int(1000 * sd_seed))
  theta, n_sets = 0.03, 500
  arm_b, arm_a = _simulate(n_sets, k, 128, theta=theta, sd_seed=sd_seed, sd_prompt=sd_prompt,
                           sd_cell=0.3, rng=rng)
  covered = []
  for i, (b, a) in enumerate(zip(arm_b, arm_a)):
    e = effects.paired_effect(b, a, n_boot=200, rng_seed=i)
    covered.append(e.ci_low <= theta <= e.ci_high)
  assert 0.92 <= np.mean(covered) <= 0.98, np.mean(covered)


def test_run_level_t_interval_coverage_at_three_seeds():
  rng = np.random.default_rng(3)
  d = 0.1 + rng.normal(0.0, 0.2, (500, 3))
  covered = [(lambda e: e.ci_low <= 0.1 <= e.ci_high)(effects.paired_effect(x, 0 * x))
             for x in d]
  assert 0.92 <= np.mean(covered) <= 0.98


def test_iqm_golden():
  assert effects.iqm([1.0, 2.0, 3.0, 10.0]) == pytest.approx(2.5)   # mean of the middle two
  assert effects.iqm([10.0, 1.0, 3.0, 2.0]) == pytest.approx(2.5)
  assert effects.iqm([4.0, 1.0, 3.0]) == pytest.approx(8.0 / 3.0)   # K < 4: nothing cut
  assert effects.paired_effect([1.0, 2.0, 3.0, 10.0], [0.0] * 4).iqm == pytest.approx(2.5)
  from scipy import stats
  x = np.random.default_rng(0).normal(size=11)                # ⌊11/4⌋ = 2 cut at each end
  assert effects.iqm(x) == pytest.approx(stats.trim_mean(x, 0.25), rel=1e-12)


def test_t_interval_of_three_numbers():
  e = effects.paired_effect([3.0, 4.0, 5.0], [2.0, 2.0, 2.0])   # d = 1, 2, 3
  half = T_975_DF2 * 1.0 / math.sqrt(3.0)                     # sd 1, se 1/√3
  assert e.mean == pytest.approx(2.0)
  assert (e.ci_low, e.ci_high) == pytest.approx((2.0 - half, 2.0 + half), rel=1e-9)
  assert e.half_width == pytest.approx(half)
  assert (e.se, e.df, e.n_seeds, e.n_prompts) == pytest.approx((1 / math.sqrt(3), 2, 3, 0))
  assert e.verdict == "unresolved"
  shifted = effects.paired_effect([3.0, 4.0, 5.0], [1.0, 1.0, 1.0])   # d = 2, 3, 4
  assert shifted.ci_low == pytest.approx(3.0 - half) and shifted.ci_low > 0
  assert shifted.verdict == "better"


def test_prompt_level_without_prompt_spread_is_the_seed_t_interval():
  seed_means = np.array([0.01, 0.04, 0.02, 0.05])
  d = np.repeat(seed_means[:, None], 16, axis=1)          # no prompt effect, no cell noise
  e = effects.paired_effect(d + 0.3, np.full_like(d, 0.3))
  ref = effects.paired_effect(seed_means, np.zeros(4))
  assert (e.ci_low, e.ci_high, e.mean, e.iqm) == pytest.approx(
      (ref.ci_low, ref.ci_high, ref.mean, ref.iqm), abs=1e-9)
  assert e.n_prompts == 16 and ref.n_prompts == 0


def test_prompt_level_without_seed_spread_is_the_prompt_clt_interval():
  rng = np.random.default_rng(0)
  p = rng.normal(0.02, 0.1, 400)
  d = np.tile(p, (5, 1))                         # every seed sees the same prompt effects
  e = effects.paired_effect(d, np.zeros_like(d), n_boot=20000)
  half = Z_975 * p.std(ddof=1) / math.sqrt(p.size)   # CLT over prompts, independent of seeds
  assert e.mean == pytest.approx(p.mean())
  assert e.half_width == pytest.approx(half, rel=0.05)
  assert e.se == pytest.approx(p.std(ddof=1) / math.sqrt(p.size), rel=1e-6)


def test_identical_arms():
  rng = np.random.default_rng(1)
  a = rng.random((4, 32))
  e = effects.paired_effect(a, a.copy())
  assert e.mean == 0.0 and e.iqm == 0.0
  assert e.ci_low <= 0.0 <= e.ci_high
  assert e.verdict == "unresolved"
  run = effects.paired_effect(a[:, 0], a[:, 0].copy())
  assert run.mean == 0.0 and run.verdict == "unresolved"


def test_arms_from_one_process_give_no_verdict():
  rng = np.random.default_rng(2)
  arm_b, arm_a = _simulate(1, 6, 256, theta=0.0, sd_seed=0.02, sd_prompt=0.05, sd_cell=0.3,
                           rng=rng)
  e = effects.paired_effect(arm_b[0], arm_a[0])
  assert e.ci_low <= 0.0 <= e.ci_high and e.verdict == "unresolved"
  assert e.half_width < 0.05


def test_large_effect_is_better_and_its_negative_worse():
  rng = np.random.default_rng(4)
  arm_b, arm_a = _simulate(1, 3, 128, theta=0.15, sd_seed=0.02, sd_prompt=0.1, sd_cell=0.3,
                           rng=rng)
  up = effects.paired_effect(arm_b[0], arm_a[0])
  down = effects.paired_effect(arm_a[0], arm_b[0])
  assert up.verdict == "better" and up.ci_low > 0
  assert down.verdict == "worse" and down.ci_high < 0
  assert down.mean == pytest.approx(-up.mean)
  assert effects.paired_effect(arm_b[0], arm_a[0], higher_is_better=False).verdict == "worse"
  runs = effects.paired_effect(arm_b[0].mean(1), arm_a[0].mean(1))
  assert runs.verdict == "better" and runs.n_prompts == 0


def test_detectable_effect():
  # large df: the normal-theory value (z_{0.975} + z_{0.8})·se
  assert effects.detectable_effect(0.01, 1e7) == pytest.approx((Z_975 + Z_80) * 0.01, rel=1e-4)
  assert effects.detectable_effect(0.0, 5) == 0.0
  assert math.isnan(effects.detectable_effect(float("nan"), 5))
  # K = 10 paired seeds: a simulated t-test at that effect rejects 80 % of the time
  k, sd = 10, 1.0
  delta = effects.detectable_effect(sd / math.sqrt(k), k - 1)
  d = np.random.default_rng(5).normal(delta, sd, (40000, k))
  t = d.mean(1) / (d.std(1, ddof=1) / math.sqrt(k))
  t_crit = 2.2621571627409915                                  # t_{0.975, 9}
  assert np.mean(np.abs(t) > t_crit) == pytest.approx(0.8, abs=0.01)
  e = effects.paired_effect(np.arange(10.0), np.zeros(10))
  assert e.detectable == pytest.approx(effects.detectable_effect(e.se, 9))


def test_non_finite_pairs_dropped_and_one_seed_gives_no_interval():
  e = effects.paired_effect([1.0, np.nan, 3.0, 2.0], [0.0, 0.0, 0.0, np.inf])
  assert e.n_seeds == 2 and e.mean == pytest.approx(2.0)
  a = np.zeros((3, 5))
  b = np.ones((3, 5))
  b[1, 2] = np.nan
  assert effects.paired_effect(b, a).n_prompts == 4
  single = effects.paired_effect([0.7], [0.5])
  assert single.mean == pytest.approx(0.2) and math.isnan(single.ci_low)
  assert single.verdict == "unresolved"
  with pytest.raises(ValueError):
    effects.paired_effect(np.zeros((3, 4)), np.zeros((3, 5)))


def test_pass_at_k_outcome_matches_exact_binomial_ratio():
  counts = np.array([[0, 1, 3, 8], [2, 5, 7, 4]])
  out = effects.pass_at_k_outcome(counts, 8, 3)
  ref = [[1 - math.comb(8 - c, 3) / math.comb(8, 3) for c in row] for row in counts]
  assert out.dtype == np.float64 and out.shape == (2, 4)
  np.testing.assert_allclose(out, ref, atol=1e-6)


def _estimates(effects_by_outcome):
  """The estimates of a report's effects (what vs-previous and vs-first share when the
  previous step is the first), without the family, adjusted p's and verdict."""
  return {o: {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in e.items()
              if k in effects.Effect._fields and k != "verdict"}
          for o, e in effects_by_outcome.items()}


def _toy_results():
  """Two steps, two seeds: a per-prompt outcome over 3 prompts and two run-level ones."""
  return {
      "naive": [{"heldout_avg@8": np.array([0.5, 0.25, 0.0]), "entropy": 0.60,
                 "wall_s": 10.0, "length_ci": (1.0, 2.0)},
                {"heldout_avg@8": np.array([0.625, 0.25, 0.125]), "entropy": 0.70,
                 "wall_s": 11.0, "length_ci": (1.0, 2.0)}],
      "clip_higher": [{"heldout_avg@8": np.array([0.75, 0.375, 0.0]), "entropy": 0.90,
                       "wall_s": 12.0, "length_ci": (1.0, 2.0)},
                      {"heldout_avg@8": [0.75, 0.5, 0.25], "entropy": 1.10, "wall_s": 12.0,
                       "length_ci": (1.0, 2.0)}],
  }


def test_report_schema_on_two_steps_and_two_seeds():
  report = ablation_report.effects_report(_toy_results(), seeds=[3, 7], lower_is_better=("wall_s",))
  json.dumps(report)                                         # plain Python types
  assert [s["name"] for s in report["steps"]] == ["naive", "clip_higher"]
  first, second = report["steps"]
  assert first["seeds"] == second["seeds"] == [3, 7]
  assert first["effects_vs_previous"] == {} and first["effects_vs_first"] == {}
  assert list(first["means"]) == ["heldout_avg@8", "entropy", "wall_s"]   # tuples ignored
  assert first["means"]["entropy"] == pytest.approx(0.65)
  assert _estimates(second["effects_vs_previous"]) == _estimates(second["effects_vs_first"])
  required = {"mean", "ci_low", "ci_high", "verdict", "half_width", "iqm", "se", "df",
              "detectable", "n_seeds", "n_prompts", "level"}
  for outcome, effect in second["effects_vs_previous"].items():
    assert required <= set(effect), outcome
    assert effect["verdict"] in effects.VERDICTS
    assert effect["ci_low"] <= effect["mean"] <= effect["ci_high"]
    assert effect["n_seeds"] == 2
  avg = second["effects_vs_previous"]["heldout_avg@8"]
  # per-seed mean differences 0.125 and 0.1667 (hand: (0.25+0.125+0)/3, (0.125+0.25+0.125)/3)
  assert avg["mean"] == pytest.approx((0.375 / 3 + 0.5 / 3) / 2)
  assert avg["level"] == "prompt" and avg["n_prompts"] == 3
  entropy = second["effects_vs_previous"]["entropy"]
  assert entropy["level"] == "run" and entropy["mean"] == pytest.approx(0.35)
  # d = 0.3, 0.4: t interval 0.35 ± 12.706·0.05 (t_{0.975,1} = 12.706)
  assert entropy["half_width"] == pytest.approx(12.706204736174698 * 0.05)
  assert entropy["verdict"] == "unresolved"
  wall = second["effects_vs_previous"]["wall_s"]
  assert wall["mean"] == pytest.approx(1.5)


def test_report_compares_with_previous_and_first():
  steps = {name: [{"x": base + seed} for seed in (0.0, 0.1, 0.3)]
           for name, base in (("a", 0.0), ("b", 1.0), ("c", 3.0))}
  steps["c"][1]["x"] += 0.05
  report = ablation_report.effects_report(steps, lower_is_better=("x",))
  third = report["steps"][2]
  assert third["effects_vs_previous"]["x"]["mean"] == pytest.approx(2.05 / 3 + 2 * 2 / 3)
  assert third["effects_vs_first"]["x"]["mean"] == pytest.approx(3.0 + 0.05 / 3)
  assert third["effects_vs_first"]["x"]["verdict"] == "worse"   # lower is better, x went up
  with pytest.raises(ValueError):
    ablation_report.effects_report({"a": [{"x": 1.0}], "b": [{"x": 1.0}, {"x": 2.0}]})


def test_a_repeated_step_is_compared_with_the_step_it_repeats():
  """`STEP@LABEL` (an A/A control listed last) is paired with STEP, not with the step
  before it; a label on a step absent from the list keeps the previous step."""
  steps = {name: [{"x": base + seed} for seed in (0.0, 0.1, 0.3)]
           for name, base in (("a", 0.0), ("b", 1.0), ("a@aa", 0.5), ("z@1", 2.0))}
  report = ablation_report.effects_report(steps)
  repeat, orphan = report["steps"][2], report["steps"][3]
  assert repeat["effects_vs_previous"]["x"]["mean"] == pytest.approx(0.5)   # vs a, not b
  assert _estimates(repeat["effects_vs_previous"]) == _estimates(repeat["effects_vs_first"])
  assert orphan["effects_vs_previous"]["x"]["mean"] == pytest.approx(1.5)   # vs a@aa


def test_markdown_table_and_forest_plot(tmp_path):
  rng = np.random.default_rng(6)
  results = {}
  for step, lift in (("naive", 0.0), ("overlong", 0.01), ("clip_higher", 0.15)):
    results[step] = [{"heldout_avg@8": np.clip(0.4 + lift + 0.02 * s + rng.normal(0, 0.1, 64),
                                               0, 1),
                      "entropy": 0.5 + lift + 0.01 * s} for s in range(4)]
  report = ablation_report.effects_report(results, n_boot=500)
  text = ablation_report.effects_markdown(report)
  lines = text.splitlines()
  assert report["primary"]["outcome"] == "heldout_avg@8"
  assert report["primary"]["steps"] == ["overlong", "clip_higher"]
  header = [line for line in lines if line.startswith("| step")]
  assert header[0].startswith("| step | effect (pts) [95 % CI] | p interval | p sign-flip |")
  assert header[1:] == ["| step | heldout_avg@8 (pts) | entropy |"] * 2   # marginal, cumulative
  assert text.count("| naive (level) |") == 2
  # 4 seeds: the sign-flip p is at least 2/16, so the primary family decides nothing
  primary_row, marginal_row, cumulative_row = [line for line in lines
                                               if line.startswith("| clip_higher |")]
  assert primary_row.endswith("| 0.12 | 0.25 | unresolved |"), primary_row
  assert re.search(r"\| unresolved \(\+1[0-9]\.\d \[\+\d+\.\d, \+\d+\.\d\]\) † \|", marginal_row)
  assert re.search(r"\| \+1[0-9]\.\d \[\+\d+\.\d, \+\d+\.\d\] better \|", cumulative_row)
  assert "no step of this family can read better, worse or equivalent; that takes 7 seeds" in text
  assert "6 of them" in text and "about 0.3 of them would read better or worse" in text
  assert "Smallest effects detectable" in text and "4 seeds and 64 prompts" in text
  path = ablation_report.plot_effects(report, tmp_path / "forest.png")
  assert path.exists() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
