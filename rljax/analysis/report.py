"""Markdown section for an ablation report: what each step's loss does relative to the first."""

from __future__ import annotations

import dataclasses
import pathlib

from rljax.analysis.loss_weights import as_variant
from rljax.analysis.plots import plot_impact
from rljax.analysis.runs import synthetic_batch
from rljax.analysis.trick_impact import format_impact_table, impact_report


def _same_loss(a, b):
  return dataclasses.replace(a, name="") == dataclasses.replace(b, name="")


def impact_section(variants, out_dir, *, batch=None, baseline=None):
  """Trick-impact tables and PNGs of every ablation step against the baseline step.

  Intended for `rljax ablate`: build `variants` with
  `{step: variant_from_config(config, name=step)}` and append the returned Markdown to
  report.md. Steps whose loss equals the baseline's (their trick acts on the data:
  dynamic sampling, reward shaping, ...) are listed as such; their effect shows in the
  curves, not in the gradient weights of a fixed batch.

  Args:
    variants: {step name: LossVariant or dict}, in ablation order.
    out_dir: directory for the PNGs (linked relative to it, so put report.md there).
    batch: dict with the keys of `runs.synthetic_batch` (a recorded rollout batch), or
      None for the synthetic GRPO-like batch.
    baseline: step to compare against (default: the first).
  Returns:
    Markdown text.
  """
  variants = {step: as_variant(v).replace(name=step) for step, v in variants.items()}
  baseline = baseline or next(iter(variants))
  base = variants[baseline]
  source = "synthetic GRPO-like" if batch is None else "recorded"
  batch = synthetic_batch() if batch is None else batch
  out_dir = pathlib.Path(out_dir)
  lines = [f"## What each step's loss promotes and suppresses (vs `{baseline}`)", "",
           f"Effective gradient weights w = −∂L/∂logπ_t on one {source} batch "
           "(`rljax.analysis.impact_report`); blue cells are promoted, red suppressed.", ""]
  for step, variant in variants.items():
    if step == baseline:
      continue
    if _same_loss(variant, base):
      lines += [f"### {step}", "", "Same loss as the baseline: this step changes the data "
                "(sampling, rewards, filters), not the per-token weights.", ""]
      continue
    report = impact_report(
        variant, base, logp_bt=batch["logp"], old_logp_bt=batch["old_logp"],
        advantages=batch["advantages"], mask=batch["mask"], entropy_bt=batch["entropy"],
        scores_b=batch.get("scores"), truncated_b=batch.get("truncated"))
    png = plot_impact(report, out_dir / f"impact_{step}.png")
    lines += [format_impact_table(report), f"![impact of {step}]({png.name})", ""]
  return "\n".join(lines)
