"""The ablation report's cells: hand-computed summaries of synthetic metric records."""

import math

from rljax.train.ablate.table import markdown_table, summarize

RESULT = {"heldout_acc_before": 0.1, "heldout_acc_after": 0.6, "heldout_avg@4": 0.5,
          "heldout_pass@4": 0.8, "wall_s": 12.0}


def _records():
  out = []
  for i in range(12):
    out.append({
        "iteration": i + 1, "update/entropy": 1.0 - 0.05 * i, "train/accuracy": 0.1 + 0.05 * i,
        "update/clip_high": 0.02 if i < 6 else 0.0,
        "update/clip_high_lowprob": 0.015 if i < 6 else 0.0,
        "train/truncated_frac": 0.1, "train/response_length_p90": float(i),
        "train/length_correct": 10.0, "train/length_incorrect": float("nan") if i == 11 else 20.0,
        "train/effective_batch": 64.0 if i % 2 else 32.0,
    })
  return out


def test_summary_cells_are_the_means_the_columns_name():
  s = summarize(RESULT, _records())
  assert s["k"] == 4 and s["avg"] == 0.5 and s["pass"] == 0.8
  # "(last)" columns: mean of the last 5 iterations (i = 7..11)
  assert math.isclose(s["entropy"], 1.0 - 0.05 * 9)
  assert math.isclose(s["length_p90"], 9.0)
  # NaN iterations are skipped, not averaged in
  assert s["length_ci"] == (10.0, 20.0)
  # share of up-clipped tokens with p_old < 0.5: 6 x 0.015 / (6 x 0.02)
  assert math.isclose(s["clip_high_lowprob"], 0.75)
  assert math.isclose(s["effective_batch"], 48.0)
  assert math.isnan(s["generation_rounds"])       # not logged: a dash in the table


def test_table_gives_mean_and_sample_sd_over_seeds():
  runs = [summarize(dict(RESULT, heldout_acc_after=a), _records()) for a in (0.5, 0.7)]
  table = markdown_table({"naive": runs})
  row = table.splitlines()[2].split(" | ")
  header = table.splitlines()[0].split(" | ")
  cell = row[header.index("held-out acc after")]
  assert cell == f"0.6 ± {math.sqrt(0.02):.2g}"
  assert row[header.index("gen rounds")] == "–"


def test_run_plot_heldout_series_has_the_points_before_and_after_rl():
  from rljax.train.run.metrics import _heldout_series

  records = [{"iteration": 10, "eval/accuracy": 0.5, "eval/avg@4": 0.4, "eval/pass@4": 0.7},
             {"iteration": 20}]
  before = {"accuracy": 0.1, "avg@4": 0.2, "pass@4": 0.5}
  after = {"accuracy": 0.9, "avg@4": 0.8, "pass@4": 0.95}
  series = _heldout_series(records, before, after, 20)
  assert series == {"greedy": [(0, 0.1), (10, 0.5), (20, 0.9)],
                    "avg@4": [(0, 0.2), (10, 0.4), (20, 0.8)],
                    "pass@4": [(0, 0.5), (10, 0.7), (20, 0.95)]}


def test_mechanism_lines_say_when_the_previous_step_does_not_log_the_metric():
  """The synchronous run logs no staleness: its level and k1's effect vs it are 'not
  logged', not nan; lower staleness (partial rollouts) reads as better."""
  from rljax.analysis.ablation_report import effects_report
  from rljax.train.ablate.report import mechanism_lines
  from rljax.train.ablate.runner import LOWER_IS_BETTER

  nan = float("nan")
  results = {"sync": [{"staleness/mean": nan}] * 3,
             "k1": [{"staleness/mean": v} for v in (1.0, 0.98, 0.99)],
             "k1_partial": [{"staleness/mean": v} for v in (0.70, 0.69, 0.71)]}
  report = effects_report(results, lower_is_better=LOWER_IS_BETTER)
  report["mechanisms"] = {"k1": "staleness/mean", "k1_partial": "staleness/mean"}
  rows = [line for line in mechanism_lines(report) if line.startswith("| k1")]
  assert rows[0] == ("| k1 | `staleness/mean` | not logged | not logged by the previous "
                     "step | – |")
  assert "nan" not in rows[1] and rows[1].endswith("| lower |"), rows[1]   # better: lower


class _Rounds:
  """A fake rollout: round r returns the groups `rounds[r]`, each a list of n scores (the
  accuracy is score > 0.5)."""

  def __init__(self, rounds, n):
    self.rounds, self.n, self.calls = rounds, n, 0

  def sample_and_score(self, model, prompts, key):
    import numpy as np

    from rljax.train.rollout.batch import RolloutBatch

    del model, key
    scores = np.asarray(self.rounds[self.calls], np.float32).reshape(-1)
    self.calls += 1
    b = scores.size
    seq = np.zeros((b, 2), np.int32)
    row = np.zeros(b, np.float32)
    return RolloutBatch(
        prompts=list(prompts), prompt_tokens=seq, prompt_mask=seq, tokens=seq, mask=seq,
        sampler_logp=seq.astype(np.float32), truncated=np.zeros(b, bool), scores=scores,
        accuracy=(scores > 0.5).astype(np.float32), format=row, reward_failed=row,
        lengths=np.full(b, 2), prompt_lengths=np.full(b, 2), extent=np.full(b, 2),
        group_id=np.repeat(np.arange(b // self.n) + 100 * self.calls, self.n), components={},
        seconds={"generate_s": 0.0, "score_s": 0.0})


def test_sampled_score_is_every_group_before_the_dynamic_sampling_filter():
  """Round 0: an all-correct group (dropped) and a mixed one; round 1: a mixed one and an
  all-wrong one (dropped). The update batch holds the two mixed groups; `train/sampled_score`
  is the mean of all four groups' scores, what the policy earned whatever the filter kept."""
  import dataclasses

  import numpy as np

  from rljax.train.config import base_config
  from rljax.train.config.specs import build_specs
  from rljax.train.rollout.train_batches import collect

  rounds = [[[1.0, 0.9], [1.0, 0.0]], [[0.0, 0.8], [0.1, 0.2]]]
  spec = dataclasses.replace(build_specs(base_config(), model_description="").rollout,
                             prompts_per_iteration=2, n=2, dynamic_sampling=True,
                             dynamic_sampling_max_rounds=5, greedy_baseline=False)
  batch, stats = collect(_Rounds(rounds, 2), None, lambda k, r: [f"p{r}{i}" for i in range(k)],
                         lambda r: r, spec)
  np.testing.assert_allclose(np.sort(batch.scores), [0.0, 0.0, 0.8, 1.0])
  assert math.isclose(stats["train/sampled_score"], np.mean(rounds), rel_tol=1e-6)
  assert stats["train/generation_rounds"] == 2
  plain = dataclasses.replace(spec, dynamic_sampling=False)
  batch, stats = collect(_Rounds(rounds, 2), None, lambda k, r: ["a", "b"], lambda r: r, plain)
  assert math.isclose(stats["train/sampled_score"], np.mean(rounds[0]), rel_tol=1e-6)
  assert stats["train/sampled_score"] == float(np.mean(batch.scores))   # = train/raw_score


def test_step_lists_with_a_replica_or_a_repeat_are_rejected_up_front():
  """`STEP@0` (and `STEP@`) is the step's own sample stream, an exact replica; a step listed
  twice would fail only after the whole ablation. Both stop `--check`; `--aa` adds FIRST@aa."""
  import pytest

  from rljax import cli

  base = ["experiments/dapo.py", "--seeds", "0-1", "--out", "/tmp/ab"]
  for steps, match in (("naive_grpo,naive_grpo@0", "stream 0"),
                       ("naive_grpo,naive_grpo@", "stream 0"),
                       ("naive_grpo,clip_higher,naive_grpo", "more than once"),
                       ("naive_grpo@1,naive_grpo@01", "same sample stream")):
    with pytest.raises(ValueError, match=match):
      cli.ablate_configs([*base, "--steps", steps])
    with pytest.raises(SystemExit) as exit_:
      cli.main(["ablate", *base, "--steps", steps, "--check"])
    assert exit_.value.code == 2
  plan = cli.ablate_configs([*base, "--aa"])
  steps = list(dict.fromkeys(step for step, _, _ in plan))
  assert steps == ["naive_grpo", "overlong_filtering", "clip_higher", "soft_overlong",
                   "token_level_loss", "dynamic_sampling", "naive_grpo@aa"]
  aa = [c for s, _, c in plan if s == "naive_grpo@aa"][0]
  assert aa.run.sample_stream != 0 and aa.run.dir == "/tmp/ab/naive_grpo@aa/seed0"
  with pytest.raises(ValueError, match="more than once"):
    cli.ablate_configs([*base, "--aa", "--steps", "naive_grpo,naive_grpo@aa"])


def test_an_experiment_file_without_get_config_is_a_clear_error(tmp_path):
  import pytest

  from rljax.train.config import load_config

  path = tmp_path / "no_config.py"
  path.write_text("ABLATION_STEPS = ('a', 'b')\n")
  with pytest.raises(ValueError, match="defines no get_config"):
    load_config(f"{path}:a")


def test_a_finished_run_of_another_config_is_named_not_reused_or_overwritten(tmp_path):
  import json
  import os

  import pytest

  from rljax.train.ablate.finished import config_differences, finished_result
  from rljax.train.config import load_config

  config = load_config("experiments/dapo.py:clip_higher", {"run.dir": str(tmp_path)})
  assert finished_result(tmp_path, config) is None            # nothing there yet
  saved = json.loads(config.to_json_best_effort(indent=2, sort_keys=True))
  (tmp_path / "config.json").write_text(json.dumps(saved))
  (tmp_path / "heldout_per_prompt.npz").write_bytes(b"")
  (tmp_path / "result.json").write_text(json.dumps({"iterations": config.run.iterations,
                                                    "wall_s": 1.0}))
  assert finished_result(tmp_path, config)["wall_s"] == 1.0
  os.utime(tmp_path / "result.json", (0, 0))                   # older than its config: restarted
  assert finished_result(tmp_path, config) is None
  os.utime(tmp_path / "result.json")
  other = load_config("experiments/dapo.py:clip_higher",
                      {"run.dir": "elsewhere", "algo.eps_high": 0.3})
  with pytest.raises(ValueError, match="algo.eps_high"):
    finished_result(tmp_path, other)
  # a field rljax gained since the run (absent from the saved config) is not a difference
  saved["algo"].pop("eps_high")
  assert config_differences(saved, json.loads(other.to_json_best_effort())) == []


def test_an_ablation_files_primary_outcome_and_margins_are_checked_before_any_run(tmp_path):
  """PRIMARY_OUTCOME must be an outcome the runs will have, EQUIVALENCE_MARGINS positive
  numbers: a typo stops `--check`, not the report after hours of runs."""
  import pytest

  from rljax.train.ablate.runner import plan

  def experiment(lines):
    path = tmp_path / f"ab{len(list(tmp_path.iterdir()))}.py"
    path.write_text("from experiments.dapo import ABLATION_STEPS, MECHANISMS, get_config\n"
                    + lines)
    return str(path)

  runs = plan(experiment("PRIMARY_OUTCOME = 'heldout_accuracy'\n"
                         "EQUIVALENCE_MARGINS = {'heldout_': 0.02, 'update/clip_high': 1e-3}\n"),
              out_dir=tmp_path / "out", seeds=[0])
  assert len(runs) == 6
  for lines, match in (("PRIMARY_OUTCOME = 'heldout_avg@4'\n", "heldout_avg@8"),
                       ("EQUIVALENCE_MARGINS = {'heldout_': -1}\n", "heldout_"),
                       ("EQUIVALENCE_MARGINS = 0.03\n", "must be a dict")):
    with pytest.raises(ValueError, match=match):
      plan(experiment(lines), out_dir=tmp_path / "out", seeds=[0])
