"""The ablation report as Markdown: the primary family's verdicts first (Holm-adjusted),
then every other cell as exploratory, marginal (vs the previous step) and cumulative (vs
the first step)."""

from __future__ import annotations

import math

import numpy as np

from rljax.analysis.effects import PERCENT_OUTCOMES

DECIDED = ("better", "worse", "equivalent")
# Outcomes that have no better direction (a trick may raise or lower them on purpose): their
# decided cells read `higher` / `lower` in the Markdown (report.json keeps the verdict word).
DIRECTIONLESS_OUTCOMES = ("final_entropy",)


def direction(effect) -> str:
  """`higher` / `lower` for a better / worse verdict, by the effect's `higher_is_better`
  (default True); any other verdict unchanged."""
  up = effect.get("higher_is_better", True)
  return {"better": "higher" if up else "lower",
          "worse": "lower" if up else "higher"}.get(effect["verdict"], effect["verdict"])


def percent_outcomes(report, percent=None) -> set:
  """Outcome names shown in percentage points: `percent`, or the names matching
  `PERCENT_OUTCOMES` (acc, avg@k, pass@k, frac, rate)."""
  names = list(report["steps"][0]["means"])
  if percent is None:
    return {n for n in names if PERCENT_OUTCOMES.search(n)}
  return set(percent)


def number(x, pts, sign=True) -> str:
  """x in points (×100, one decimal) or to 3 significant digits; "–" when not finite."""
  if not math.isfinite(x):
    return "–"
  if pts:
    return f"{100 * x:+.1f}" if sign else f"{100 * x:.1f}"
  return f"{x:+.3g}" if sign else f"{x:.3g}"


def p_value(p) -> str:
  """A p-value as printed: "<0.001", three decimals below 0.1, two above, "–" for NaN."""
  if p is None or not math.isfinite(p):
    return "–"
  if p < 0.001:
    return "<0.001"
  return f"{p:.3f}" if p < 0.1 else f"{p:.2f}"


def cell(effect, pts, *, bold=True, directionless=False) -> str:
  """`+4.1 [+1.9, +6.3] better`, `equivalent (+0.3 [−1.2, +1.8], ±3.0)` or
  `unresolved (+1.4 [−3.3, +6.1])`; a primary verdict that survives its adjustment in bold
  (with `bold`); `directionless`: `higher` / `lower` in place of better / worse."""
  if not effect:
    return "–"
  mean = number(effect["mean"], pts)
  if not math.isfinite(effect["ci_low"]):
    return f"{mean} (1 seed)"
  ci = f"[{number(effect['ci_low'], pts)}, {number(effect['ci_high'], pts)}]"
  v = effect["verdict"]
  if v in ("better", "worse"):
    text = f"{mean} {ci} {direction(effect) if directionless else v}"
  elif v == "equivalent":
    text = f"equivalent ({mean} {ci}, ±{number(effect['margin'], pts, sign=False)})"
  else:
    text = f"{v} ({mean} {ci})"
  if effect.get("family") == "primary":
    return f"**{text}** †" if bold and v in DECIDED else f"{text} †"
  return text


def sign_flip_floor(n_seeds: int, m: int, alpha: float) -> str:
  """One sentence when K seeds cannot give a primary verdict: the sign-flip test's smallest
  two-sided p, 2/2^K, is not below Holm's first threshold α/m (nor its one-sided 1/2^K
  below α/(2m), for equivalence); "" otherwise."""
  floor = 2.0 / 2**n_seeds
  if m == 0 or floor < alpha / m:
    return ""
  need = int(math.floor(math.log2(2 * m / alpha))) + 1
  return (f"With {n_seeds} seeds the exact sign-flip p is at least 2/2^{n_seeds} = "
          f"{floor:.3g}, not below Holm's first threshold {alpha:g}/{m} = {alpha / m:.3g}: no "
          f"step of this family can read better, worse or equivalent; that takes {need} seeds.")


def primary_markdown(report, *, percent=None) -> list:
  """The primary family's table: each step's marginal effect on the primary outcome, the
  interval's and the sign-flip p, their maximum and its Holm adjustment, the verdict."""
  primary = report.get("primary") or {}
  outcome, names = primary.get("outcome"), primary.get("steps", [])
  if not outcome or not names:
    return []
  pts = outcome in percent_outcomes(report, percent)
  steps = [s for s in report["steps"] if s["name"] in names]
  n_seeds, alpha = len(report["steps"][0]["seeds"]), primary.get("alpha", 0.05)
  margin = steps[0]["effects_vs_previous"][outcome]["margin"]
  level = 100 * report.get("confidence", 0.95)
  unit = " (pts)" if pts else ""
  lines = [f"**Primary family**: `{outcome}` vs the previous step, the marginal effect of "
           f"each step's technique, one test per step (m = {len(steps)}). p is the larger of "
           f"the {level:g} % interval's p and the exact sign-flip p over the {n_seeds} seeds, "
           "Holm-adjusted over the family; `equivalent`: both one-sided tests (TOST, the same "
           f"two p's) reject |effect| ≥ {number(margin, pts, sign=False)}"
           f"{' pts' if pts else ''} after Holm.",
           "", f"| step | effect{unit} [{level:g} % CI] | p interval | p sign-flip | p "
           "| p Holm | verdict |", "|---|---|---|---|---|---|---|"]
  for step in steps:
    e = step["effects_vs_previous"][outcome]
    lines.append(f"| {step['name']} | {number(e['mean'], pts)} [{number(e['ci_low'], pts)}, "
                 f"{number(e['ci_high'], pts)}] | {p_value(e['p_interval'])} | "
                 f"{p_value(e['p_sign_flip'])} | {p_value(e['p'])} | "
                 f"{p_value(e['p_adjusted'])} | "
                 + (f"**{e['verdict']}** |" if e["verdict"] in DECIDED else f"{e['verdict']} |"))
  floor = sign_flip_floor(n_seeds, len(steps), alpha)
  return lines + (["", floor] if floor else []) + [""]


def _detectable_line(steps, key, outcomes, pts, n_seeds) -> list:
  detect = []
  for o in outcomes:
    values = [s[key][o]["detectable"] for s in steps[1:] if o in s[key]]
    values = [v for v in values if math.isfinite(v)]
    n_prompts = max([s[key][o]["n_prompts"] for s in steps[1:] if o in s[key]], default=0)
    if values:
      where = f"{n_seeds} seeds" + (f" and {n_prompts} prompts" if n_prompts else "")
      detect.append(f"{o}: ±{number(float(np.median(values)), o in pts, sign=False)}"
                    f"{' pts' if o in pts else ''} ({where})")
  if not detect:
    return []
  return ["", "Smallest effects detectable (80 % power, two-sided, median over steps): "
          + "; ".join(detect) + "."]


def exploratory_line(report) -> str:
  """How many exploratory cells can read better or worse by chance."""
  cells = sum(e.get("family") == "exploratory" and math.isfinite(e["ci_low"])
              for s in report["steps"] for k in ("effects_vs_previous", "effects_vs_first")
              for e in s[k].values())
  alpha = 1.0 - report.get("confidence", 0.95)
  return (f"**Exploratory**: every other cell, {cells} of them, each with its unadjusted "
          f"{100 * (1 - alpha):g} % interval: if no effect were real, about "
          f"{alpha * cells:.1f} of them would read better or worse by chance.")


def effects_markdown(report, *, percent=None):
  """Markdown of an `effects_report`: the primary family, then the exploratory tables of
  marginal (vs the previous step) and cumulative (vs the first step) effects.

  One row per step, one column per outcome. A cell reads `+4.1 [+1.9, +6.3] better` (mean
  of B − A, its interval, verdict), `equivalent (+0.3 [−1.2, +1.8], ±3.0)` (the interval
  inside ± the margin) or `unresolved (+1.4 [−3.3, +6.1])`; † marks the primary cell (its
  verdict is the adjusted one, bold when decided). The first row gives the first step's
  level (mean over seeds and prompts). A last line per table gives, per outcome, the median
  smallest effect detectable with 80 % power at the report's level.

  Args:
    report: `effects_report` output.
    percent: outcome names holding fractions in [0, 1], shown in percentage points ("pts");
      default: names matching `PERCENT_OUTCOMES`.
  Returns:
    Markdown text.
  """
  steps = report["steps"]
  outcomes = list(steps[0]["means"])
  pts = percent_outcomes(report, percent)
  level = 100 * report.get("confidence", 0.95)
  header = ["step"] + [f"{o} (pts)" if o in pts else o for o in outcomes]
  n_seeds = len(steps[0]["seeds"])
  sections = ["\n".join(primary_markdown(report, percent=percent) + [exploratory_line(report)])]
  for key, title in (("effects_vs_previous", "Marginal effect, vs the previous step (a repeat "
                                             "STEP@LABEL: vs STEP, its A/A control)"),
                     ("effects_vs_first", "Cumulative effect, vs the first step "
                                          f"({steps[0]['name']}): every technique added so far")):
    lines = [f"{title}: mean paired difference over {n_seeds} seeds (and the held-out "
             f"prompts for per-prompt outcomes), {level:g} % CI, verdict. Columns marked (pts) "
             "are fractions shown in percentage points; † the primary family's cell.", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines.append("| " + " | ".join(
        [f"{steps[0]['name']} (level)"]
        + [number(steps[0]["means"][o], o in pts, sign=False) for o in outcomes]) + " |")
    for step in steps[1:]:
      lines.append("| " + " | ".join(
          [step["name"]] + [cell(step[key].get(o), o in pts,
                                 directionless=o in DIRECTIONLESS_OUTCOMES)
                            for o in outcomes]) + " |")
    sections.append("\n".join(lines + _detectable_line(steps, key, outcomes, pts, n_seeds)))
  return "\n\n".join(sections) + "\n"
