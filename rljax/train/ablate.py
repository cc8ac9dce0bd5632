"""Ablation runner: every step of an experiment file, same seeds, one Markdown table + plots."""

from __future__ import annotations

import json
import pathlib
import re

from rljax import analysis
from rljax.analysis.runs import load_batch
from rljax.train import metrics
from rljax.train.config import _import_module, load_config, parse_override_value

TABLE_COLUMNS = (
    ("held-out acc before", "heldout_acc_before"), ("held-out acc after", "heldout_acc_after"),
    ("avg@k", "avg"), ("pass@k", "pass"), ("entropy (last)", "entropy"),
    ("mean length (last)", "length"), ("effective batch (mean)", "effective_batch"),
    ("wall s", "wall_s"),
)


def _parse_sets(items):
  out = {}
  for item in items:
    key, sep, value = item.partition("=")
    if not sep:
      raise ValueError(f"--set expects FIELD=VALUE, got {item!r}")
    out[key] = parse_override_value(value)
  return out


def summarize(result, records):
  """One table row from a run's RESULT dict and its metric records."""
  last = records[-1] if records else {}
  k = max((int(m.group(1)) for m in map(re.compile(r"heldout_pass@(\d+)$").match, result) if m),
          default=0)
  eff = [r["train/effective_batch"] for r in records if "train/effective_batch" in r]
  return {
      "heldout_acc_before": result["heldout_acc_before"],
      "heldout_acc_after": result["heldout_acc_after"],
      "avg": result.get(f"heldout_avg@{k}", float("nan")),
      "pass": result.get(f"heldout_pass@{k}", float("nan")),
      "entropy": last.get("update/entropy", float("nan")),
      "length": last.get("train/response_length_mean", float("nan")),
      "effective_batch": sum(eff) / len(eff) if eff else float("nan"),
      "wall_s": result["wall_s"], "k": k,
  }


def markdown_table(rows):
  k = next((r["k"] for r in rows.values()), 0)
  header = ["step"] + [name.replace("@k", f"@{k}") for name, _ in TABLE_COLUMNS]
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  for step, row in rows.items():
    cells = [step] + [f"{row[key]:.3f}" if isinstance(row[key], float) else str(row[key])
                      for _, key in TABLE_COLUMNS]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def overlay_plot(run_dirs, out_path):
  """Reward, accuracy, entropy and length of several runs on shared axes."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  keys = (("reward", "train/reward"), ("held-out accuracy", "eval/accuracy"),
          ("entropy", "update/entropy"), ("response length", "train/response_length_mean"))
  fig, axes = plt.subplots(1, 4, figsize=(18, 4))
  for name, run_dir in run_dirs.items():
    records = metrics.read_metrics(run_dir)
    for ax, (_, key) in zip(axes, keys):
      pts = [(r["iteration"], r[key]) for r in records if isinstance(r.get(key), (int, float))]
      if pts:
        ax.plot(*zip(*pts), label=name)
  for ax, (title, _) in zip(axes, keys):
    ax.set_title(title)
    ax.set_xlabel("iteration")
    ax.grid(alpha=0.3)
  axes[0].legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(out_path, dpi=80)
  plt.close(fig)


def run_ablation(experiment, *, out_dir=None, overrides=()):
  """Runs every `ABLATION_STEPS` entry of `experiment`; returns the report path."""
  from rljax.train.loop import train

  path = pathlib.Path(experiment)
  steps = getattr(_import_module(path), "ABLATION_STEPS", None)
  if not steps:
    raise ValueError(f"{experiment} defines no ABLATION_STEPS tuple")
  out = pathlib.Path(out_dir or f"runs/ablate_{path.stem}")
  out.mkdir(parents=True, exist_ok=True)
  extra = _parse_sets(overrides)
  rows, run_dirs, variants = {}, {}, {}
  for step in steps:
    config = load_config(f"{experiment}:{step}", {**extra, "run.dir": str(out / step)})
    variants[step] = analysis.variant_from_config(config, name=step)
    result = train(config)
    run_dirs[step] = config.run.dir
    rows[step] = summarize(result, metrics.read_metrics(config.run.dir))
    (out / "results.json").write_text(json.dumps(rows, indent=2))
  overlay_plot(run_dirs, out / "curves.png")
  impact = analysis.impact_section(variants, out, batch=load_batch(run_dirs[steps[0]]))
  report = out / "report.md"
  report.write_text(
      f"# Ablation: {path.name}\n\nSame seeds for every step. Overrides: {extra or 'none'}.\n\n"
      + markdown_table(rows) + "\n\n![curves](curves.png)\n\n"
      + "Per-run curves: " + ", ".join(f"[{s}]({s}/curves.png)" for s in steps) + "\n\n"
      + impact + "\n\nOpen `notebooks/analysis.ipynb` with `RLJAX_RUNS=" + str(out)
      + "` for token statistics and pass@k curves of every step.\n")
  return report


def evaluate_run(run_dir):
  """Re-evaluates the latest checkpoint of a run on its held-out prompts."""
  import jax
  from flax import nnx

  from rljax.train import checkpoint
  from rljax.train.config import ConfigDict
  from rljax.train.evaluate import evaluate
  from rljax.train.setup import build, init_state

  run_dir = pathlib.Path(run_dir)
  config = ConfigDict(json.loads((run_dir / "config.json").read_text()))
  setup = build(config)
  ckpt = checkpoint.Checkpointer(run_dir, keep=config.run.keep_checkpoints)
  template = init_state(setup, setup.initial_actor,
                        with_reference=config.algo.kl_placement != "none")
  restored = ckpt.restore_latest(template)
  if restored is None:
    raise FileNotFoundError(f"no readable checkpoint in {run_dir}/checkpoints")
  _, state, _ = restored
  model = nnx.merge(setup.actor_graphdef, state.actor)
  return evaluate(setup.ctx, model, setup.task.heldout_prompts(), jax.random.key(0),
                  n=config.sampling.eval_n, temperature=config.sampling.eval_temperature)
