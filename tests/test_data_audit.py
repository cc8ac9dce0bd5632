"""Data audit: planted mislabeled prompts are flagged with high precision and recall."""

import numpy as np

from rljax.data.audit import audit, audit_prompt, cluster_answers, format_report
from rljax.rewards.math import is_equivalent


def _synthetic_set(seed=0, n=300, k=16):
  """Simulated samples. Kinds: easy, hard, hard with one systematic wrong answer, mislabeled."""
  rng = np.random.default_rng(seed)
  records, planted = [], set()
  for i in range(n):
    truth = int(rng.integers(10, 1000))
    kind = rng.choice(["easy", "hard", "systematic", "mislabeled"], p=[0.45, 0.35, 0.05, 0.15])
    label = truth
    if kind == "mislabeled":  # close and plausible, like 4.5 for 4
      label = truth + int(rng.choice([-1, 1])) if rng.random() < 0.5 else truth * 10
      planted.add(f"p{i}")
    p_true = {"easy": rng.uniform(0.6, 0.95), "hard": rng.uniform(0.0, 0.3),
              "systematic": rng.uniform(0.0, 0.2), "mislabeled": rng.uniform(0.6, 0.95)}[kind]
    samples = []
    for _ in range(k):
      u = rng.random()
      if u < p_true:
        samples.append(str(truth))
      elif kind == "systematic" and u < p_true + 0.6:
        samples.append(str(truth + 7))
      elif kind == "mislabeled" and u < p_true + 0.05:
        samples.append(str(label))  # the occasional accidental "match" with a wrong label
      else:
        samples.append(str(int(rng.integers(0, 10000))))
    records.append({"id": f"p{i}", "answer": str(label), "samples": samples})
  return records, planted


def test_planted_mislabeled_precision_and_recall():
  records, planted = _synthetic_set()
  rows = audit(records)
  flagged = {r.prompt_id for r in rows if r.verdict == "likely_mislabeled"}
  tp = len(flagged & planted)
  precision, recall = tp / max(len(flagged), 1), tp / len(planted)
  print(f"audit: planted={len(planted)} flagged={len(flagged)} precision={precision:.3f} "
        f"recall={recall:.3f}")
  assert precision >= 0.75 and recall >= 0.9
  # Ranked report: the flagged rows come first, by suspicion.
  head = rows[:len(flagged)]
  assert all(r.verdict == "likely_mislabeled" for r in head)
  assert [r.suspicion for r in head] == sorted((r.suspicion for r in head), reverse=True)
  assert "likely_mislabeled" in format_report(rows, limit=5)


def test_hard_vs_wrong_golden():
  # Model agrees on 4 (12/16), label 4.5 (a ticket count): likely mislabeled.
  wrong = audit_prompt("tickets", "4.5", ["4"] * 12 + ["4.5"] + ["5", "3", "6"])
  assert wrong.verdict == "likely_mislabeled" and wrong.majority_answer == "4"
  assert abs(wrong.suspicion - 0.75 * (1 - 1 / 16)) < 1e-12
  hard = audit_prompt("hard", "17", ["17", "3", "5", "8", "13", "21", "1", "2"])
  assert (hard.verdict, hard.accuracy, hard.suspicion) == ("hard", 1 / 8, 0.0)
  assert audit_prompt("u", "1", ["2", "3", "4", "5"]).verdict == "unsolved"
  assert audit_prompt("ok", "1", ["1", "1", "2"]).verdict == "ok"


def test_math_equivalence_clusters_surface_forms():
  answers = ["4.5张", "9/2", "\\frac{9}{2}", "4"]
  assert cluster_answers(answers, is_equivalent) == [[0, 1, 2], [3]]
  row = audit_prompt("t", "4.5", answers, equivalent=is_equivalent)
  assert (row.verdict, row.accuracy) == ("ok", 0.75)
