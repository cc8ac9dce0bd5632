"""The DAPO tables of README.md and docs/results.md, generated from the committed report.

    python docs/results/make_tables.py            # print every table
    python docs/results/make_tables.py --write    # rewrite them in README.md and docs/results.md

`docs/results/dapo.json` is the report.json of `rljax ablate experiments/dapo.py --seeds 0-7
--aa` (its provenance names the commit the runs came from), `docs/results/dapo_runs.json` its
results.json (every run's summary, for the per-seed table). In the Markdown files each table
sits between `<!-- make_tables: NAME -->` and `<!-- /make_tables -->`;
tests/test_results_tables.py checks that they equal what this script prints.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys

import numpy as np

from rljax.analysis.ablation_markdown import cell, p_value, primary_markdown

ROOT = pathlib.Path(__file__).resolve().parents[2]
REPORT = ROOT / "docs" / "results" / "dapo.json"
RUNS = ROOT / "docs" / "results" / "dapo_runs.json"   # the ablation's results.json
FILES = (ROOT / "README.md", ROOT / "docs" / "results.md")
BLOCK = re.compile(r"(<!-- make_tables: (\S+) -->\n)(.*?)(<!-- /make_tables -->)", re.S)

STEPS = {"naive_grpo": "naive GRPO", "overlong_filtering": "+ overlong filtering",
         "clip_higher": "+ clip-higher (ε_high 0.28)",
         "soft_overlong": "+ soft overlong punishment", "token_level_loss": "+ token-level loss",
         "dynamic_sampling": "+ dynamic sampling", "naive_grpo@aa": "naive GRPO again (A/A)"}
MECHANISMS = {"train/truncated_loss_tokens": ("loss tokens of truncated samples per iteration",
                                              False),
              "update/clip_high": ("upper clip fraction", True),
              "train/truncated_frac": ("truncated samples", True),
              "train/length_incorrect": ("length of incorrect samples (tokens)", False),
              "train/effective_batch": ("effective batch (of 128)", False)}
AVG, GREEDY, AUC = "heldout_avg@8", "heldout_accuracy", "train_reward_auc"


def _pass_k(report) -> str:
  return next(o for o in report["steps"][0]["means"] if o.startswith("heldout_pass@"))


def provenance(report) -> str:
  """Where the numbers come from: the runs' commit, JAX, the CPU, the runs' time."""
  p = report["provenance"]
  steps, seeds = len(report["steps"]), len(report["steps"][0]["seeds"])
  commits = " and ".join(f"`{c.strip()[:10]}`" for c in p["commit"].split("|"))
  return (f"From `docs/results/dapo.json`: {steps} steps × {seeds} seeds, runs at commit "
          f"{commits} (JAX {p['jax']}, {p['cpu']}), {report['runs_wall_s'] / 60:.0f} min of "
          "runs (the sum of the runs' wall times, on a machine shared with other jobs).")


def levels(report) -> str:
  """The first step's levels."""
  m = report["steps"][0]["means"]
  pk = _pass_k(report)
  return (f"Levels of naive GRPO: avg@8 {100 * m[AVG]:.1f} %, greedy {100 * m[GREEDY]:.1f} %, "
          f"{pk.removeprefix('heldout_')} {100 * m[pk]:.1f} % (on 128 prompts), train-reward "
          f"AUC {m[AUC]:.3f}, final entropy {m['final_entropy']:.3f} nats.")


def _mechanism(report, step, prev) -> str:
  metric = report.get("mechanisms", {}).get(step["name"])
  if not metric or metric not in step["effects_vs_previous"]:
    return ""
  label, pts = MECHANISMS.get(metric, (metric, False))
  before, after = prev["means"][metric], step["means"][metric]
  e = step["effects_vs_previous"][metric]
  scale, unit = (100.0, " %") if pts else (1.0, "")
  fmt = lambda x, sign="": f"{scale * x:{sign}.3g}"   # noqa: E731
  interval = f"{fmt(e['mean'], '+')} [{fmt(e['ci_low'], '+')}, {fmt(e['ci_high'], '+')}]"
  moved = e["ci_low"] > 0 or e["ci_high"] < 0   # the direction is the finding, not a verdict
  where = ("rises" if e["ci_low"] > 0 else "falls") if moved else "unresolved"
  return (f"{label}: {fmt(before)} → {fmt(after)}{unit}; {interval}{' pts' if pts else ''} "
          f"{where}")


def readme_table(report) -> str:
  """README: the primary family (avg@8 vs the previous step, Holm), the cumulative effect
  vs naive GRPO and what each step's mechanism did."""
  steps = {s["name"]: s for s in report["steps"]}
  names = list(steps)
  lines = ["| step | marginal: avg@8 vs the previous step † | p (Holm) | cumulative: avg@8 "
           "vs naive GRPO | what its mechanism did (vs the previous step) |",
           "|---|---|---|---|---|"]
  for i, name in enumerate(names[1:], start=1):
    s = steps[name]
    e = s["effects_vs_previous"][AVG]
    first = "" if "@" in name else cell(s["effects_vs_first"][AVG], True)
    mech = "the control" if "@" in name else _mechanism(report, s, steps[names[i - 1]])
    holm = p_value(e["p_adjusted"]) if e["family"] == "primary" else "–"
    lines.append(f"| {STEPS.get(name, name)} | {cell(e, True)} | {holm} | {first} | {mech} |")
  return "\n".join(lines)


def results_table(report) -> str:
  """docs/results.md: every held-out outcome, marginal and cumulative."""
  pk = _pass_k(report)
  short = pk.removeprefix("heldout_")
  lines = [f"| step | avg@8 vs previous | greedy vs previous | {short} vs previous | avg@8 vs "
           "naive GRPO (cumulative) | greedy vs naive GRPO (cumulative) |",
           "|---|---|---|---|---|---|"]
  for s in report["steps"][1:]:
    prev, first = s["effects_vs_previous"], s["effects_vs_first"]
    if "@" in s["name"]:   # the A/A copy: its previous step is the step it repeats
      cells = ["", "", "", cell(prev[AVG], True), cell(prev[GREEDY], True)]
    else:
      cells = [cell(prev[AVG], True), cell(prev[GREEDY], True), cell(prev[pk], True),
               cell(first[AVG], True), cell(first[GREEDY], True)]
    lines.append(f"| {STEPS.get(s['name'], s['name'])} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def mechanism_table(report) -> str:
  """docs/results.md: the metric each step's trick acts on, before → after (exploratory)."""
  steps = report["steps"]
  lines = ["| step | what its mechanism did (vs the previous step; exploratory) |", "|---|---|"]
  for prev, s in zip(steps, steps[1:]):
    text = _mechanism(report, s, prev)
    if text:
      lines.append(f"| {STEPS.get(s['name'], s['name'])} | {text} |")
  return "\n".join(lines)


def _spread(values, scale=100.0) -> str:
  mean, sd = scale * np.mean(values), scale * np.std(values, ddof=1)
  return f"{mean:.1f} ± {sd:.1f}"


def seeds_table(runs, report) -> str:
  """docs/results.md: naive GRPO (the main job) seed by seed, and the mean ± sd."""
  rows = runs["naive_grpo"]
  seeds = report["steps"][0]["seeds"]
  lines = ["| seed | greedy acc, SFT → RL | avg@8 | pass@8 | wall s, SFT included (shared "
           "machine) |", "|---|---|---|---|---|"]
  for seed, r in zip(seeds, rows):
    lines.append(f"| {seed} | {100 * r['heldout_acc_before']:.1f} → "
                 f"{100 * r['heldout_acc_after']:.1f} % | {100 * r['avg']:.1f} % | "
                 f"{100 * r['pass']:.1f} % | {r['wall_s']:.0f} |")
  return "\n".join(lines + [seeds_summary(runs, report, wall=False)])


def seeds_summary(runs, report, *, wall=True) -> str:
  """The mean ± sd row over seeds (README: with pass@64 and the wall-time range)."""
  rows = runs["naive_grpo"]
  before = [r["heldout_acc_before"] for r in rows]
  after = [r["heldout_acc_after"] for r in rows]
  gain = np.subtract(after, before)
  cells = [f"{_spread(before)} → {_spread(after)} % ({100 * gain.mean():+.1f} ± "
           f"{100 * gain.std(ddof=1):.1f}, min {100 * gain.min():+.1f})",
           f"{_spread([r['avg'] for r in rows])} %"]
  passes = _spread([r["pass"] for r in rows])
  if not wall:
    return "| mean ± sd | " + " | ".join(cells + [f"{passes} %", ""]) + " |"
  pk = report["steps"][0]["means"][_pass_k(report)]
  walls = [r["wall_s"] for r in rows]
  return (f"| {len(rows)} seeds | greedy acc, SFT → RL | avg@8 | pass@8 / pass@64 | wall, SFT included "
          "(shared machine) |\n|---|---|---|---|---|\n"
          "| mean ± sd | " + " | ".join(cells + [f"{passes} / {100 * pk:.1f} %",
                                                   f"{min(walls):.0f}–{max(walls):.0f} s"])
          + " |")


def tables(report, runs) -> dict:
  """{block name: Markdown} of every generated block."""
  primary = "\n".join(primary_markdown(report, percent={AVG})).strip()
  return {"dapo_provenance": provenance(report), "dapo_levels": levels(report),
          "dapo_readme": readme_table(report), "dapo_primary": primary,
          "dapo_results": results_table(report), "dapo_mechanisms": mechanism_table(report),
          "dapo_seeds": seeds_table(runs, report), "dapo_seeds_readme": seeds_summary(runs, report)}


def fill(text: str, generated: dict) -> str:
  """`text` with every `make_tables` block replaced by its generated Markdown."""
  def replace(match):
    return f"{match.group(1)}{generated[match.group(2)]}\n{match.group(4)}"
  return BLOCK.sub(replace, text)


def blocks(text: str) -> dict:
  """{name: content} of the `make_tables` blocks in `text`."""
  return {m.group(2): m.group(3).rstrip("\n") for m in BLOCK.finditer(text)}


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--write", action="store_true", help="rewrite the blocks in place")
  args = parser.parse_args(argv)
  generated = tables(json.loads(REPORT.read_text()), json.loads(RUNS.read_text()))
  if args.write:
    for path in FILES:
      path.write_text(fill(path.read_text(), generated))
  for name, text in generated.items():
    print(f"<!-- make_tables: {name} -->\n{text}\n<!-- /make_tables -->\n")
  return generated


if __name__ == "__main__":
  sys.exit(main() and 0)
