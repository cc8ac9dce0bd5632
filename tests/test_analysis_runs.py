"""Run-directory helpers of the notebook: discovery, metric series, ablation tables."""

import json
import math

import numpy as np

from rljax.analysis import runs


def _run(path, records):
  path.mkdir(parents=True)
  (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
  return path


def test_expand_run_dirs_and_series(tmp_path):
  a = _run(tmp_path / "a", [{"iteration": 1, "train/reward": 0.5},
                            {"iteration": 2, "train/reward": "nan"},
                            {"iteration": 3, "train/reward": 0.7, "eval/accuracy": 0.4}])
  abl = tmp_path / "ablate_x"
  _run(abl / "s1", [{"iteration": 1}])
  _run(abl / "s2", [{"iteration": 1}])
  (abl / "results.json").write_text(json.dumps({"s1": {"heldout_acc_after": 0.25, "k": 4},
                                                "s2": {"heldout_acc_after": 0.5, "k": 4}}))
  found = runs.expand_run_dirs(f"{a}, {abl},{tmp_path / 'missing'}")
  assert list(found) == ["a", "ablate_x/s1", "ablate_x/s2"]
  xs, ys = runs.series(runs.read_records(a), "train/reward")
  np.testing.assert_array_equal(xs, [1, 3])  # the "nan" record is skipped
  np.testing.assert_allclose(ys, [0.5, 0.7])
  assert runs.series(runs.read_records(a), "absent")[0].size == 0
  assert runs.ablation_dirs(f"{a},{abl}") == [abl]
  table = runs.ablation_table(abl)  # no report.md: built from results.json
  assert table.splitlines()[0] == "| step | heldout_acc_after | k |"
  assert "| s2 | 0.500 | 4 |" in table


def test_pass_at_k_curve_of_run_prefers_result_json(tmp_path):
  run = _run(tmp_path / "r", [{"iteration": 1, "eval/pass@1": 0.1, "eval/pass@2": 0.2}])
  np.testing.assert_allclose(runs.pass_at_k_curve_of_run(run), [0.1, 0.2])
  (run / "result.json").write_text(json.dumps(
      {"heldout_pass@1": 0.3, "heldout_pass@2": 0.4, "heldout_pass@3": 0.5}))
  np.testing.assert_allclose(runs.pass_at_k_curve_of_run(run), [0.3, 0.4, 0.5])


def test_synthetic_batch_is_a_valid_grpo_batch():
  b = runs.synthetic_batch(seed=1, batch=16, max_len=12, group=4)
  mask = b["mask"] > 0
  assert np.all(b["logp"] < 0) and np.all(b["old_logp"] < 0)  # proper probabilities
  adv_g = b["advantages"].reshape(-1, 4)
  np.testing.assert_allclose(adv_g.sum(-1), 0.0, atol=1e-5)  # group-centred
  assert np.all(mask[:, 0]) and not math.isnan(float(b["entropy"][mask].mean()))


def test_impact_section_compares_steps_with_the_baseline(tmp_path):
  from rljax.analysis.report import impact_section
  from rljax.analysis.trick_impact import LossVariant

  base = LossVariant(name="baseline")
  text = impact_section(
      {"baseline": base, "clip_higher": base.replace(eps_high=0.28),
       "dynamic_sampling": base.replace(name="dynamic_sampling")}, tmp_path)
  assert "### clip_higher vs baseline" in text
  assert "![impact of clip_higher](impact_clip_higher.png)" in text
  assert (tmp_path / "impact_clip_higher.png").stat().st_size > 2000
  assert "### dynamic_sampling\n\nSame loss as the baseline" in text
  assert not (tmp_path / "impact_dynamic_sampling.png").exists()
  # clip-higher touches positive-advantage tokens only.
  rows = [r for r in text.splitlines() if r.startswith("| A<0")]
  assert rows and all(r.endswith("| unchanged |") for r in rows)


def test_ablation_variants_from_config_json(tmp_path):
  from rljax.analysis.trick_impact import LossVariant

  algo = dict(policy_loss="ppo", ratio_level="token", eps_low=0.2, eps_high=0.2, dual_clip=0.0,
              ratio_cap=0.0, loss_agg="seq_mean_token_mean", high_entropy_fraction=0.0,
              psr_weight=1.0, nsr_weight=1.0, overlong_filter=False)
  abl = tmp_path / "ablate_y"
  for step, changes in (("token_mean", {"loss_agg": "token_mean"}), ("base", {}),
                        ("no_config", None)):
    (abl / step).mkdir(parents=True)
    if changes is not None:
      (abl / step / "config.json").write_text(json.dumps(
          {"algo": {**algo, **changes}, "sampling": {"max_new_tokens": 16}}))
  (abl / "results.json").write_text(json.dumps({"base": {}, "token_mean": {}, "no_config": {}}))
  variants = runs.ablation_variants(abl)
  assert list(variants) == ["base", "token_mean"]  # results.json order; no config: skipped
  assert variants["token_mean"] == LossVariant(name="token_mean", loss_agg="token_mean",
                                               max_len=16)
