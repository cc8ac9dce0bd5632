"""Data audit: tell "hard" prompts from "wrong" (mislabeled) ones from many samples each.

A hard problem is one the model usually gets wrong and occasionally
solves; a wrong problem is one the model usually answers consistently, is marked wrong
because the label differs, and occasionally "matches" the label by accident. So, from K
sampled final answers per prompt:

- cluster the answers by equivalence; the majority cluster has share `agreement`;
- `accuracy` = share of answers equivalent to the label;
- `likely_mislabeled` iff the majority answer differs from the label, `agreement` >=
  `min_agreement` and `accuracy` <= `max_accuracy`; suspicion = agreement·(1 − accuracy);
- otherwise `hard` iff 0 < accuracy <= `hard_accuracy`, `unsolved` iff accuracy == 0,
  else `ok`.

Command line: `python -m rljax.data.audit samples.jsonl` where each line is
`{"id": ..., "answer": ..., "samples": [answer strings]}`; prints the ranked report.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from typing import NamedTuple

from rljax.answers import is_equivalent


class AuditRow(NamedTuple):
  prompt_id: str
  label: str
  verdict: str  # "likely_mislabeled" | "hard" | "unsolved" | "ok"
  suspicion: float  # agreement·(1 − accuracy) when the majority differs from the label, else 0
  accuracy: float
  agreement: float
  majority_answer: str
  n_samples: int


def _exact(a: str, b: str) -> bool:
  return a.strip() == b.strip()


def cluster_answers(answers: Sequence[str], equivalent: Callable[[str, str], bool]) -> list[list[int]]:
  """Greedy clustering: each answer joins the first cluster whose representative it equals."""
  clusters: list[list[int]] = []
  for i, a in enumerate(answers):
    for c in clusters:
      if equivalent(a, answers[c[0]]):
        c.append(i)
        break
    else:
      clusters.append([i])
  return clusters


def audit_prompt(prompt_id: str, label: str, answers: Sequence[str], *,
                 equivalent: Callable[[str, str], bool] = _exact, min_agreement: float = 0.5,
                 max_accuracy: float = 0.25, hard_accuracy: float = 0.5) -> AuditRow:
  """Audits one prompt from its sampled final answers (thresholds in the module doc)."""
  if not answers:
    raise ValueError(f"audit: prompt {prompt_id!r} has no samples")
  n = len(answers)
  correct = [equivalent(a, label) for a in answers]
  accuracy = sum(correct) / n
  clusters = cluster_answers(answers, equivalent)
  top = max(clusters, key=len)
  agreement = len(top) / n
  majority_is_label = correct[top[0]]
  suspicion = 0.0 if majority_is_label else agreement * (1.0 - accuracy)
  if not majority_is_label and agreement >= min_agreement and accuracy <= max_accuracy:
    verdict = "likely_mislabeled"
  elif accuracy == 0:
    verdict = "unsolved"
  elif accuracy <= hard_accuracy:
    verdict = "hard"
  else:
    verdict = "ok"
  return AuditRow(str(prompt_id), str(label), verdict, suspicion, accuracy, agreement,
                  str(answers[top[0]]), n)


def audit(records: Sequence[dict], **kwargs) -> list[AuditRow]:
  """Audits `{"id", "answer", "samples"}` records; rows ranked by suspicion, then difficulty."""
  rows = [audit_prompt(r["id"], r["answer"], r["samples"], **kwargs) for r in records]
  return sorted(rows, key=lambda r: (-r.suspicion * (r.verdict == "likely_mislabeled"),
                                     r.verdict != "hard", r.accuracy))


def format_report(rows: Sequence[AuditRow], *, limit: int = 50) -> str:
  """Markdown table of the first `limit` rows plus verdict counts."""
  counts = {v: sum(r.verdict == v for r in rows)
            for v in ("likely_mislabeled", "hard", "unsolved", "ok")}
  lines = [f"verdicts: {counts}", "",
           "| id | verdict | suspicion | accuracy | agreement | majority | label |",
           "|---|---|---|---|---|---|---|"]
  for r in rows[:limit]:
    lines.append(f"| {r.prompt_id} | {r.verdict} | {r.suspicion:.2f} | {r.accuracy:.2f} | "
                 f"{r.agreement:.2f} | {r.majority_answer} | {r.label} |")
  return "\n".join(lines)


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("samples", help='JSONL: {"id", "answer", "samples": [...]} per line')
  ap.add_argument("--math", action="store_true", help="use rljax.answers.is_equivalent")
  ap.add_argument("--limit", type=int, default=50)
  args = ap.parse_args(argv)
  with open(args.samples, encoding="utf-8") as f:
    records = [json.loads(line) for line in f if line.strip()]
  kwargs = {}
  if args.math:

    kwargs["equivalent"] = is_equivalent
  print(format_report(audit(records, **kwargs), limit=args.limit))


if __name__ == "__main__":
  main()
