"""The figures behind the ablation verdicts (docs/results.md, "How to read the verdicts"):
false verdicts in simulated null ablations and coverage under three kinds of seed effects,
for the rule before (every cell's interval read alone) and after (the primary family,
Holm-adjusted, with the sign-flip test beside the interval).

    python docs/results/simulate_verdicts.py [--reports 200] [--sets 20000] [--seeds 8]

`--seeds` (a comma list) replaces both the null reports' seed counts (default 6, 10) and the
coverage cells' (default 4, 6, 10).

Null ablations: 6 steps (a primary family of 5 tests) that do nothing, shaped like the DAPO
ablation's report: per run, held-out avg@8 and greedy correctness on 128 prompts, pass@64 on
64 of them (per-prompt outcomes), and the train-reward AUC (run-level). Every run of a seed
shares that seed's level; each run adds its own seed-level noise (what separates two arms of
one seed: sd 0.03, the A/A control's size) and per-prompt sampling noise.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from rljax.analysis import ablation_report, effects, verdicts

OUTCOMES = ("heldout_avg@8", "heldout_accuracy", "heldout_pass@64", "train_reward_auc")


def null_results(rng, *, steps=6, seeds=6, prompts=128):
  """{step: [outcomes per seed]} of an ablation whose steps all do the same thing."""
  level = rng.uniform(0.1, 0.9, prompts)                     # prompt difficulty
  seed = rng.normal(0.0, 0.10, (seeds, 1))                   # the warm start's level
  out = {}
  for j in range(steps):
    run = rng.normal(0.0, 0.03, (seeds, 1))                  # the run's own seed-level luck
    p = np.clip(level + seed + run + rng.normal(0.0, 0.05, (seeds, prompts)), 0.0, 1.0)
    avg8 = rng.binomial(8, p) / 8
    greedy = (p + rng.normal(0.0, 0.1, p.shape) > 0.5).astype(float)
    pass64 = 1.0 - (1.0 - p[:, :prompts // 2]) ** 64
    auc = 0.7 + seed[:, 0] + run[:, 0] * 0.3 + rng.normal(0.0, 0.005, seeds)
    out[f"step{j}"] = [{"heldout_avg@8": avg8[k], "heldout_accuracy": greedy[k],
                        "heldout_pass@64": pass64[k], "train_reward_auc": float(auc[k])}
                       for k in range(seeds)]
  return out


def false_verdicts(n_reports, seeds, rng, n_boot=300) -> dict:
  """Before: every cell of the 4 outcomes vs the previous and the first step read by its
  own interval (40 cells); after: the primary family (avg@8 vs previous, Holm, sign-flip)."""
  before, after, exploratory = [], [], []
  for _ in range(n_reports):
    report = ablation_report.effects_report(null_results(rng, seeds=seeds), n_boot=n_boot)
    cells = [e for s in report["steps"][1:] for key in ("effects_vs_previous", "effects_vs_first")
             for e in s[key].values()]
    before.append(sum(effects.verdict(e["ci_low"], e["ci_high"]) in ("better", "worse")
                      for e in cells))
    after.append(sum(e["verdict"] in ("better", "worse") for e in cells
                     if e["family"] == "primary"))
    exploratory.append(sum(e["verdict"] in ("better", "worse") for e in cells
                           if e["family"] == "exploratory"))
  before, after, exploratory = map(np.asarray, (before, after, exploratory))
  return {"seeds": seeds, "reports": n_reports, "cells": len(cells),
          "before_false_per_report": float(before.mean()),
          "before_any_false": float(np.mean(before > 0)),
          "after_primary_any_false": float(np.mean(after > 0)),
          "after_exploratory_false_per_report": float(exploratory.mean())}


def seed_effects(setting, n_sets, k, rng):
  """Per-seed differences [S, K] and the true mean (as in tests/test_analysis_verdicts.py)."""
  if setting == "normal":
    return 0.05 + rng.normal(0.0, 0.05, (n_sets, k)), 0.05
  if setting == "heavy-tailed (t3)":
    return 0.05 + 0.05 * rng.standard_t(3, (n_sets, k)), 0.05
  bad = rng.random((n_sets, k)) < 0.2
  return np.where(bad, 0.0, 0.10) + rng.normal(0.0, 0.01, (n_sets, k)), 0.08


def coverage(n_sets, rng, seed_counts=(4, 6, 10)) -> list:
  """Coverage of the true mean by the interval alone (before) and by the combined rule."""
  rows = []
  for setting in ("normal", "heavy-tailed (t3)", "rare bad seed"):
    for k in seed_counts:
      d, theta = seed_effects(setting, n_sets, k, rng)
      _, low, high, p_interval = effects.seed_t_interval(d - theta)
      p = np.maximum(p_interval, verdicts.sign_flip_pvalue(d, theta=theta))
      rows.append({"setting": setting, "seeds": k,
                   "before": float(np.mean((low <= 0) & (0 <= high))),
                   "after": float(np.mean(p >= 0.05))})
  return rows


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--reports", type=int, default=200)
  parser.add_argument("--sets", type=int, default=20000)
  parser.add_argument("--seeds", default=None,
                      help="comma-separated seed counts for both parts (default 6,10 / 4,6,10)")
  args = parser.parse_args(argv)
  seeds = [int(k) for k in args.seeds.split(",")] if args.seeds else None
  rng = np.random.default_rng(2026)
  out = {"false_verdicts": [false_verdicts(args.reports, k, rng) for k in (seeds or (6, 10))],
         "coverage": coverage(args.sets, rng, seeds or (4, 6, 10))}
  for row in out["false_verdicts"]:
    print(f"null reports, {row['seeds']} seeds ({row['reports']} reports, {row['cells']} cells "
          f"each): before {row['before_false_per_report']:.2f} false better/worse per report, "
          f"at least one in {100 * row['before_any_false']:.1f} %; after, primary family: at "
          f"least one in {100 * row['after_primary_any_false']:.1f} % (exploratory cells: "
          f"{row['after_exploratory_false_per_report']:.2f} per report, labelled as such)")
  for row in out["coverage"]:
    print(f"coverage, {row['setting']}, {row['seeds']} seeds: before "
          f"{100 * row['before']:.1f} %, after {100 * row['after']:.1f} %")
  print("RESULT " + json.dumps(out))
  return out


if __name__ == "__main__":
  main()
