"""The ablation report: report.json (machine-readable effects), report.md (verdicts first,
then the mechanism each step acts through, the descriptive table, the starts, compile
reuse), the forest plot and the curves."""

from __future__ import annotations

import copy
import json
import math
import pathlib

from rljax.analysis.ablation_markdown import direction
from rljax.analysis.ablation_report import effects_markdown, effects_report, plot_effects
from rljax.train.ablate.outcomes import periodic_iterations, periodic_outcomes, prompt_ids
from rljax.train.ablate.table import markdown_table, overlay_plot

# The outcomes report.md's tables and plot show (the mechanism metrics get their own section).
HEADLINE = ("heldout_avg@", "heldout_accuracy", "heldout_pass@", "train_reward_auc",
            "final_entropy")


def headline_outcomes(report) -> list:
  """The outcomes report.md's effect tables show, in `HEADLINE` order."""
  names = list(report["steps"][0]["means"])
  return [n for prefix in HEADLINE for n in names if n.startswith(prefix)]


def compile_summary(compiles, cache_dir) -> dict:
  """Programs compiled by the first run and by all later ones, and seconds saved."""
  later = compiles[1:]
  return {"cache_dir": str(cache_dir),
          "first_run": {k: v for k, v in compiles[0].items() if k not in ("step", "seed")}
          if compiles else {},
          "later_runs_misses": sum(c["cache_misses"] for c in later),
          "later_runs_hits": sum(c["cache_hits"] for c in later),
          "saved_s": round(sum(c["saved_s"] for c in compiles), 1),
          "compile_s": round(sum(c["compile_s"] for c in compiles), 1), "runs": compiles}


def _only(report, outcomes):
  out = copy.deepcopy(report)
  for step in out["steps"]:
    for key in ("means", "effects_vs_previous", "effects_vs_first"):
      step[key] = {k: v for k, v in step[key].items() if k in outcomes}
  return out


def mechanism_lines(report) -> list:
  """One line per step: the effect vs the previous step on the metric its trick acts on."""
  lines = []
  for step in report["steps"][1:]:
    metric = report.get("mechanisms", {}).get(step["name"].partition("@")[0])
    effect = step["effects_vs_previous"].get(metric) if metric else None
    if not effect:
      continue
    level = report["steps"][0]["means"][metric]
    level = f"{level:.3g}" if math.isfinite(level) else "not logged"
    if not math.isfinite(effect["mean"]):   # the previous step does not log the metric
      lines.append(f"| {step['name']} | `{metric}` | {level} | not logged by the previous "
                   "step | – |")
      continue
    ci = (f"[{effect['ci_low']:+.3g}, {effect['ci_high']:+.3g}]"
          if math.isfinite(effect["ci_low"]) else "(1 seed)")
    lines.append(f"| {step['name']} | `{metric}` | {level} "
                 f"| {effect['mean']:+.3g} {ci} | {direction(effect)} |")
  if not lines:
    return []
  return ["## The mechanism each step acts through", "",
          "The metric the trick's paper says it moves, mean over iterations; effect vs the "
          "previous step (paired over seeds; exploratory: each interval alone, unadjusted; "
          "higher / lower when the interval excludes 0).", "",
          "| step | metric | first step's level | effect vs previous | direction |",
          "|---|---|---|---|---|", *lines, ""]


def _start_lines(report) -> list:
  starts = report.get("starts", {})
  if not starts:
    return []
  fmt = lambda x: "–" if not isinstance(x, float) or not math.isfinite(x) else f"{x:.3f}"  # noqa: E731
  rows = [f"| {seed} | {fmt(s['heldout_accuracy_before'])} | {fmt(s['worked_share'])} | "
          f"{fmt(s['worked_accuracy'])} | {fmt(s['direct_accuracy'])} |"
          for seed, s in starts.items()]
  return ["## The starts", "",
          "Per seed, the warm start every step of that seed begins from: held-out greedy "
          "accuracy, and in its first rollout the share of completions in the task's worked "
          "mode (scratchpad, tool call) with their accuracy, and the accuracy of the others.",
          "", "| seed | greedy acc before | worked share | worked acc | direct acc |",
          "|---|---|---|---|---|", *rows, ""]


def trajectory(run_dirs, seeds, **options) -> dict:
  """{iteration: effects_report} of the periodic per-prompt evaluations every run saved
  (`run.eval_every`): the paired effects after each number of iterations (`options`: the
  report's primary outcome and margins)."""
  runs = [d for dirs in run_dirs.values() for d in dirs]
  common = set.intersection(*(set(periodic_iterations(d)) for d in runs)) if runs else set()
  out = {}
  for it in sorted(common):
    name = f"heldout_per_prompt_it{it}.npz"
    results = {step: [periodic_outcomes(d, it) for d in dirs] for step, dirs in run_dirs.items()}
    ids = {step: [prompt_ids(d, name) for d in dirs] for step, dirs in run_dirs.items()}
    out[it] = effects_report(results, seeds=seeds, n_boot=500, prompt_ids=ids, **options)
  return out


def _trajectory_lines(trajectory_reports) -> list:
  """Effect vs the first step after each periodic evaluation: where effects stop moving."""
  if len(trajectory_reports) < 2:
    return []
  first = next(iter(trajectory_reports.values()))
  outcome = next((o for o in first["steps"][0]["means"] if o.startswith("heldout_avg@")), None)
  if outcome is None:
    return []
  steps = [s["name"] for s in first["steps"][1:]]
  lines = ["## Effects over iterations", "",
           f"`{outcome}` vs the first step after each periodic evaluation (points; mean ± "
           "half-width of the 95 % CI): the iteration count is enough once they stop "
           "moving.", "", "| iteration | " + " | ".join(steps) + " |",
           "|---" * (len(steps) + 1) + "|"]
  for it, rep in trajectory_reports.items():
    cells = []
    for step in rep["steps"][1:]:
      e = step["effects_vs_first"][outcome]
      cells.append(f"{100 * e['mean']:+.1f} ± {100 * e['half_width']:.1f}"
                   if math.isfinite(e["half_width"]) else f"{100 * e['mean']:+.1f}")
    lines.append(f"| {it} | " + " | ".join(cells) + " |")
  return lines + [""]


def write(out, report, tables, run_dirs, impact) -> pathlib.Path:
  """Writes report.json, report.md, effects.png and curves.png under `out`."""
  out = pathlib.Path(out)
  periodic = trajectory(run_dirs, report["steps"][0]["seeds"],
                        primary_outcome=report["primary"]["outcome"],
                        margins={k: v for k, v in report["margins"].items() if v is not None})
  if periodic:
    report["trajectory"] = {str(it): rep for it, rep in periodic.items()}
  (out / "report.json").write_text(json.dumps(report, indent=2, default=float))
  headline = headline_outcomes(report)
  plot_effects(report, out / "effects.png", outcomes=headline)
  overlay_plot(run_dirs, out / "curves.png")
  c = report["compile"]
  seeds = report["steps"][0]["seeds"]
  text = [f"# Ablation: {report['experiment']}", "",
          f"{len(report['steps'])} steps × seeds {seeds}, {report['wall_s']:.0f} s"
          + (f" ({report['runs_reused']} runs read from their finished run directories, "
             "not trained again)" if report.get("runs_reused") else "") + ". "
          f"Overrides: {report['overrides'] or 'none'}. The arms of a seed share the warm "
          "start, the prompts and the sampling keys; effects are paired over seeds (and over "
          "the held-out prompts for per-prompt outcomes).", "",
          effects_markdown(_only(report, headline)), "![effects](effects.png)", "",
          "![curves](curves.png) (mean ± one sd over seeds)", "",
          *mechanism_lines(report), *_trajectory_lines(periodic),
          "## Every step's metrics (mean ± sd over seeds)", "",
          markdown_table(tables), "", *_start_lines(report),
          "## Compiled programs", "",
          f"Persistent cache `{c['cache_dir']}`: after the first run, the runs found "
          f"{c['later_runs_hits']} programs compiled and compiled {c['later_runs_misses']} "
          f"anew; {c['saved_s']:.0f} s of compilation saved ({c['compile_s']:.0f} s spent).",
          "", impact, ""]
  path = out / "report.md"
  path.write_text("\n".join(text))
  return path
