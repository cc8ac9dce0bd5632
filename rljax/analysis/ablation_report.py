"""The ablation report's statistics: every step's paired effect on every outcome, against
the previous and the first step (`effects_report`), as a markdown table
(`effects_markdown`) and a forest plot (`plot_effects`). The statistics themselves are in
`rljax.analysis.effects`.
"""

from __future__ import annotations

import math

import numpy as np

from rljax.analysis.effects import (
    PERCENT_OUTCOMES,
    paired_effect,
)
from rljax.analysis.plots import pyplot, save_figure


def _outcome_value(value):
  """float or float [N] array for a numeric metric value, None for anything else."""
  if isinstance(value, bool):
    return None
  if isinstance(value, (int, float, np.integer, np.floating)):
    return float(value)
  if isinstance(value, (list, np.ndarray)):
    array = np.asarray(value)
    if array.ndim == 1 and array.size and np.issubdtype(array.dtype, np.number):
      return array.astype(np.float64)
  return None


def _stack(runs, outcome, step):
  values = [_outcome_value(run[outcome]) for run in runs]
  if isinstance(values[0], float):
    return np.array(values)
  sizes = {v.size for v in values}
  if len(sizes) != 1:
    raise ValueError(f"{step}: outcome {outcome!r} has per-prompt arrays of sizes "
                     f"{sorted(sizes)} across seeds; prompts must be the same for pairing")
  return np.stack(values)


def _outcomes(results):
  """Outcome names numeric in every seed of every step, in first-seen order, one kind each."""
  names = []
  for runs in results.values():
    for run in runs:
      names += [key for key in run if key not in names]
  keep = []
  for name in names:
    values = [_outcome_value(run.get(name)) for runs in results.values() for run in runs]
    if all(v is not None for v in values) and len({isinstance(v, float) for v in values}) == 1:
      keep.append(name)
  return keep


def _previous(names, i):
  """The step step i is compared with: the one before it, or for a repeat `STEP@LABEL`
  (an A/A control) the step it repeats."""
  repeated = names[i].partition("@")[0]
  return repeated if "@" in names[i] and repeated in names[:i] else names[i - 1]


def effects_report(results, *, seeds=None, outcomes=None, confidence=0.95, n_boot=2000,
                   rng_seed=0, lower_is_better=()):
  """Machine-readable ablation report: the paired effect of every step vs the previous and
  vs the first step, for every outcome.

  Args:
    results: {step name: [per-seed dict outcome name -> float | float [N]]}, steps in
      ablation order, every step with the same seeds in the same order (index i of every
      list is the same seed, hence the same SFT start, prompt order and sampling keys).
      Floats are run-level outcomes; 1-D arrays (or lists) are per-prompt outcomes over the
      same N held-out prompts. Non-numeric values (tuples, strings) are ignored.
    seeds: seed ids for the report (default 0..K−1).
    outcomes: outcome names to compare (default: every name that is numeric in every run,
      of one kind throughout).
    confidence, n_boot, rng_seed: passed to `paired_effect`.
    lower_is_better: outcome names for which a decrease is "better".
  Returns:
    {"confidence": float, "steps": [{"name": step, "seeds": [...], "means": {outcome: mean
    over seeds and prompts}, "effects_vs_previous" (a repeat `STEP@LABEL`: vs STEP, its A/A
    control): {outcome: Effect.to_dict() plus
    "level" ("prompt" | "run")}, "effects_vs_first": {...}}, ...]}; the first step's effect
    dicts are empty.
  Raises:
    ValueError: if steps have different numbers of seeds or per-prompt sizes differ.
  """
  if not results:
    raise ValueError("effects_report needs at least one step")
  counts = {step: len(runs) for step, runs in results.items()}
  if len(set(counts.values())) != 1:
    raise ValueError(f"every step needs the same seeds, got runs per step {counts}")
  n_seeds = next(iter(counts.values()))
  seeds = list(range(n_seeds)) if seeds is None else list(seeds)
  if len(seeds) != n_seeds:
    raise ValueError(f"{len(seeds)} seed ids for {n_seeds} runs per step")
  outcomes = _outcomes(results) if outcomes is None else list(outcomes)
  stacked = {step: {o: _stack(runs, o, step) for o in outcomes} for step, runs in results.items()}
  names = list(results)

  def compare(step_b, step_a):
    out = {}
    for outcome in outcomes:
      b, a = stacked[step_b][outcome], stacked[step_a][outcome]
      if b.shape != a.shape:
        raise ValueError(f"outcome {outcome!r}: {step_b} has shape {b.shape}, {step_a} "
                         f"{a.shape}")
      effect = paired_effect(b, a, confidence=confidence, n_boot=n_boot, rng_seed=rng_seed,
                             higher_is_better=outcome not in lower_is_better)
      out[outcome] = {**effect.to_dict(), "level": "prompt" if b.ndim == 2 else "run"}
    return out

  steps = []
  for i, step in enumerate(names):
    steps.append({
        "name": step, "seeds": seeds,
        "means": {o: float(np.nanmean(stacked[step][o])) for o in outcomes},
        "effects_vs_previous": compare(step, _previous(names, i)) if i else {},
        "effects_vs_first": compare(step, names[0]) if i else {},
    })
  return {"confidence": float(confidence), "steps": steps}


def _percent_outcomes(report, percent):
  names = list(report["steps"][0]["means"])
  if percent is None:
    return {n for n in names if PERCENT_OUTCOMES.search(n)}
  return set(percent)


def _number(x, pts, sign=True):
  if not math.isfinite(x):
    return "–"
  if pts:
    return f"{100 * x:+.1f}" if sign else f"{100 * x:.1f}"
  return f"{x:+.3g}" if sign else f"{x:.3g}"


def _cell(effect, pts):
  if not effect or not math.isfinite(effect["ci_low"]):
    return "–" if not effect else f"{_number(effect['mean'], pts)} (1 seed)"
  if effect["verdict"] == "none":
    return (f"none ({_number(effect['mean'], pts)} ± "
            f"{_number(effect['half_width'], pts, sign=False)})")
  return (f"{_number(effect['mean'], pts)} [{_number(effect['ci_low'], pts)}, "
          f"{_number(effect['ci_high'], pts)}] {effect['verdict']}")


def effects_markdown(report, *, percent=None):
  """Markdown tables of an `effects_report`: effects vs the previous step, then vs the first.

  One row per step, one column per outcome. A cell reads `+4.1 [+1.9, +6.3] better`
  (mean of B − A and its interval, verdict) or `none (+0.3 ± 1.2)` (the interval covers 0;
  mean ± half-width). The first row gives the first step's level (mean over seeds and
  prompts). A last line per table gives, per outcome, the median smallest effect detectable
  with 80 % power at the report's level.

  Args:
    report: `effects_report` output.
    percent: outcome names holding fractions in [0, 1], shown in percentage points ("pts");
      default: names matching `PERCENT_OUTCOMES` (acc, avg@k, pass@k, frac, rate).
  Returns:
    Markdown text.
  """
  steps = report["steps"]
  outcomes = list(steps[0]["means"])
  pts = _percent_outcomes(report, percent)
  level = 100 * report.get("confidence", 0.95)
  header = ["step"] + [f"{o} (pts)" if o in pts else o for o in outcomes]
  n_seeds = len(steps[0]["seeds"])
  sections = []
  for key, title in (("effects_vs_previous", "vs the previous step (a repeat STEP@LABEL: vs "
                                             "STEP, its A/A control)"),
                     ("effects_vs_first", f"vs the first step ({steps[0]['name']})")):
    lines = [f"Effect {title}: mean paired difference over {n_seeds} seeds (and the held-out "
             f"prompts for per-prompt outcomes), {level:g} % CI, verdict. Columns marked (pts) "
             "are fractions shown in percentage points.", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines.append("| " + " | ".join(
        [f"{steps[0]['name']} (level)"]
        + [_number(steps[0]["means"][o], o in pts, sign=False) for o in outcomes]) + " |")
    for step in steps[1:]:
      lines.append("| " + " | ".join(
          [step["name"]] + [_cell(step[key].get(o), o in pts) for o in outcomes]) + " |")
    detect = []
    for o in outcomes:
      values = [s[key][o]["detectable"] for s in steps[1:] if o in s[key]]
      values = [v for v in values if math.isfinite(v)]
      n_prompts = max([s[key][o]["n_prompts"] for s in steps[1:] if o in s[key]], default=0)
      if values:
        where = f"{n_seeds} seeds" + (f" and {n_prompts} prompts" if n_prompts else "")
        detect.append(f"{o}: ±{_number(float(np.median(values)), o in pts, sign=False)}"
                      f"{' pts' if o in pts else ''} ({where})")
    if detect:
      lines += ["", "Smallest effects detectable (80 % power, two-sided, median over steps): "
                + "; ".join(detect) + "."]
    sections.append("\n".join(lines))
  return "\n\n".join(sections) + "\n"


def plot_effects(report, out_path, *, outcomes=None, percent=None):
  """Forest plot of an `effects_report`: one panel per outcome, one row per step, each
  step's effect and CI vs the previous step and vs the first step, a vertical line at 0.
  Hollow markers: the interval covers 0 (verdict "none").

  Args:
    report: `effects_report` output.
    out_path: PNG path.
    outcomes: outcome names to draw (default: all in the report).
    percent: as in `effects_markdown`.
  Returns:
    the PNG path.
  """

  plt = pyplot()
  steps = report["steps"]
  outcomes = list(steps[0]["means"]) if outcomes is None else list(outcomes)
  pts = _percent_outcomes(report, percent)
  fig, axes = plt.subplots(1, max(1, len(outcomes)), squeeze=False, layout="constrained",
                           figsize=(4.2 * max(1, len(outcomes)), 0.5 * len(steps) + 1.6))
  y = np.arange(len(steps))[::-1]
  series = (("effects_vs_previous", "vs previous", "o", "tab:blue", 0.15),
            ("effects_vs_first", "vs first", "s", "tab:orange", -0.15))
  for ax, outcome in zip(axes[0], outcomes):
    scale = 100.0 if outcome in pts else 1.0
    for key, label, marker, color, dy in series:
      rows = [(y[i] + dy, s[key][outcome]) for i, s in enumerate(steps) if outcome in s[key]]
      for j, (yy, e) in enumerate(r for r in rows if math.isfinite(r[1]["ci_low"])):
        err = [[(e["mean"] - e["ci_low"]) * scale], [(e["ci_high"] - e["mean"]) * scale]]
        ax.errorbar([e["mean"] * scale], [yy], xerr=err, capsize=3, fmt=marker, color=color,
                    ms=5, mfc="white" if e["verdict"] == "none" else color,
                    label=None if j else label)
    ax.axvline(0.0, color="black", lw=0.8)
    ax.set_yticks(y, [f"{steps[0]['name']} (reference)"] + [s["name"] for s in steps[1:]],
                  fontsize=8)
    ax.set_ylim(-0.6, len(steps) - 0.4)
    ax.set_xlabel(f"effect ({'points' if outcome in pts else 'outcome units'}), "
                  f"{100 * report.get('confidence', 0.95):g} % CI")
    ax.set_title(outcome, fontsize=10)
    ax.grid(alpha=0.3, axis="x")
  if axes[0][0].lines or axes[0][0].collections:
    axes[0][0].legend(fontsize=7)
  return save_figure(fig, out_path, plt)
