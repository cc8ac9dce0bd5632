"""The ablation report's statistics: every step's paired effect on every outcome, against
the previous (marginal) and the first step (cumulative), with the primary family's
verdicts (`effects_report`), and a forest plot (`plot_effects`); the markdown is
`rljax.analysis.ablation_markdown`. The statistics themselves are in
`rljax.analysis.effects` and `rljax.analysis.verdicts`.
"""

from __future__ import annotations

import math

import numpy as np

from rljax.analysis.ablation_markdown import effects_markdown, percent_outcomes
from rljax.analysis.effects import paired_effect
from rljax.analysis.plots import pyplot, save_figure
from rljax.analysis.verdicts import assign_families

# Smallest effects of interest (outcome units) by outcome-name prefix: 3 points of held-out
# accuracy, avg@n and pass@k, and 0.03 of the train reward's AUC (a reward on [0, 1]).
# Entropy and the mechanism metrics have no natural margin: no equivalence verdict.
DEFAULT_MARGINS = {"heldout_avg@": 0.03, "heldout_accuracy": 0.03, "heldout_pass@": 0.03,
                   "train_reward_auc": 0.03}


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


def check_pairing(prompt_ids, seeds) -> None:
  """Stops the report unless every step and seed evaluated the same held-out prompts in
  the same order: per-prompt outcomes are paired by position.

  Args:
    prompt_ids: {step: [prompt ids, array [N], per seed]} in the report's order.
    seeds: seed ids, for the message.
  Raises:
    ValueError: naming the first step and seed whose ids differ, and where.
  """
  if all(ids is None for runs in prompt_ids.values() for ids in runs):
    return   # no per-prompt outcomes
  (first_step, first_runs), = list(prompt_ids.items())[:1]
  reference = np.asarray(first_runs[0])
  for step, runs in prompt_ids.items():
    for seed, ids in zip(seeds, runs):
      ids = np.asarray(ids)
      if ids.shape == reference.shape and np.array_equal(ids, reference):
        continue
      where = (f"sizes {ids.size} and {reference.size}" if ids.shape != reference.shape else
               f"position {int(np.flatnonzero(ids != reference)[0])}")
      raise ValueError(f"step {step!r}, seed {seed}: its held-out prompt ids differ from step "
                       f"{first_step!r}, seed {seeds[0]} ({where}); per-prompt outcomes are "
                       "paired by position, so no report is written")


def margin_for(outcome, margins) -> float | None:
  """The smallest effect of interest of `outcome`: the entry of `margins` ({outcome name or
  name prefix: margin}) with the longest matching name, or None."""
  matches = [key for key in margins if outcome.startswith(key)]
  return margins[max(matches, key=len)] if matches else None


def primary_outcome_of(outcomes, primary=None) -> str | None:
  """The primary outcome: `primary` (checked), else the first held-out avg@n, else greedy
  held-out accuracy, else None (no primary family)."""
  if primary is not None:
    if primary not in outcomes:
      raise ValueError(f"PRIMARY_OUTCOME {primary!r} is not an outcome of this ablation; "
                       f"outcomes: {list(outcomes)}")
    return primary
  return next((o for o in outcomes if o.startswith("heldout_avg@")),
              "heldout_accuracy" if "heldout_accuracy" in outcomes else None)


def effects_report(results, *, seeds=None, outcomes=None, confidence=0.95, n_boot=2000,
                   rng_seed=0, lower_is_better=(), prompt_ids=None, primary_outcome=None,
                   margins=None):
  """Machine-readable ablation report: the paired effect of every step vs the previous
  (marginal) and vs the first step (cumulative), for every outcome, with the verdicts of
  `rljax.analysis.verdicts.assign_families`.

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
    prompt_ids: {step: [held-out prompt ids per seed]}: checked equal everywhere
      (`check_pairing`) before anything is compared.
    primary_outcome: the outcome of the primary family (default `primary_outcome_of`).
    margins: {outcome name or prefix: smallest effect of interest} (default
      `DEFAULT_MARGINS`; merged over it).
  Returns:
    {"confidence", "primary": {"outcome", "comparison", "steps", "alpha"}, "margins",
    "steps": [{"name": step, "seeds": [...], "means": {outcome: mean over seeds and
    prompts}, "effects_vs_previous" (a repeat `STEP@LABEL`: vs STEP, its A/A control):
    {outcome: Effect.to_dict() plus "level" ("prompt" | "run"), "comparison" ("marginal" |
    "cumulative"), "family", "p", "p_adjusted", "p_equivalence", "p_equivalence_adjusted",
    "verdict"}, "effects_vs_first": {...}}, ...]}; the first step's effect dicts are empty.
  Raises:
    ValueError: if steps have different numbers of seeds, per-prompt sizes or prompt ids
      differ, or the primary outcome is not an outcome.
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
  if prompt_ids:
    check_pairing(prompt_ids, seeds)
  outcomes = _outcomes(results) if outcomes is None else list(outcomes)
  primary = primary_outcome_of(outcomes, primary_outcome)
  margins = {**DEFAULT_MARGINS, **(margins or {})}
  stacked = {step: {o: _stack(runs, o, step) for o in outcomes} for step, runs in results.items()}
  names = list(results)

  def compare(step_b, step_a, comparison):
    out = {}
    for outcome in outcomes:
      b, a = stacked[step_b][outcome], stacked[step_a][outcome]
      if b.shape != a.shape:
        raise ValueError(f"outcome {outcome!r}: {step_b} has shape {b.shape}, {step_a} "
                         f"{a.shape}")
      better_up = outcome not in lower_is_better
      effect = paired_effect(b, a, confidence=confidence, n_boot=n_boot, rng_seed=rng_seed,
                             higher_is_better=better_up, margin=margin_for(outcome, margins))
      out[outcome] = {**effect.to_dict(), "level": "prompt" if b.ndim == 2 else "run",
                      "comparison": comparison, "higher_is_better": better_up}
    return out

  steps = []
  for i, step in enumerate(names):
    steps.append({
        "name": step, "seeds": seeds,
        "means": {o: float(np.nanmean(stacked[step][o])) for o in outcomes},
        "effects_vs_previous": compare(step, _previous(names, i), "marginal") if i else {},
        "effects_vs_first": compare(step, names[0], "cumulative") if i else {},
    })
  alpha = 1.0 - confidence
  family = assign_families(steps, primary, alpha=alpha)
  return {"confidence": float(confidence),
          "primary": {"outcome": primary, "comparison": "effects_vs_previous",
                      "steps": family, "alpha": alpha},
          "margins": {o: margin_for(o, margins) for o in outcomes}, "steps": steps}


def plot_effects(report, out_path, *, outcomes=None, percent=None):
  """Forest plot of an `effects_report`: one panel per outcome, one row per step, each
  step's effect and CI vs the previous step and vs the first step, a vertical line at 0.
  Hollow markers: no better / worse verdict.

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
  pts = percent_outcomes(report, percent)
  fig, axes = plt.subplots(1, max(1, len(outcomes)), squeeze=False, layout="constrained",
                           figsize=(4.2 * max(1, len(outcomes)), 0.5 * len(steps) + 1.6))
  y = np.arange(len(steps))[::-1]
  series = (("effects_vs_previous", "marginal (vs previous)", "o", "tab:blue", 0.15),
            ("effects_vs_first", "cumulative (vs first)", "s", "tab:orange", -0.15))
  for ax, outcome in zip(axes[0], outcomes):
    scale = 100.0 if outcome in pts else 1.0
    for key, label, marker, color, dy in series:
      rows = [(y[i] + dy, s[key][outcome]) for i, s in enumerate(steps) if outcome in s[key]]
      for j, (yy, e) in enumerate(r for r in rows if math.isfinite(r[1]["ci_low"])):
        err = [[(e["mean"] - e["ci_low"]) * scale], [(e["ci_high"] - e["mean"]) * scale]]
        ax.errorbar([e["mean"] * scale], [yy], xerr=err, capsize=3, fmt=marker, color=color,
                    ms=5, mfc=color if e["verdict"] in ("better", "worse") else "white",
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


__all__ = ["DEFAULT_MARGINS", "check_pairing", "effects_markdown", "effects_report",
           "margin_for", "plot_effects", "primary_outcome_of"]
