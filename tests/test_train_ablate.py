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
  assert "nan" not in rows[1] and rows[1].endswith("| better |"), rows[1]
