"""What an ablation compares: each run's outcomes, per prompt where they have prompts.

Per-prompt outcomes (paired by seed and prompt): `heldout_avg@n` (each held-out prompt's
success rate over its n samples), `heldout_accuracy` (greedy correctness), and
`heldout_pass@K` (unbiased pass@K on the large-k subset). Run-level outcomes (paired by
seed): `train_reward_auc` (the mean over iterations of `train/sampled_score`, the score of
every completion sampled, before reward shaping and before the dynamic-sampling filter: the
area under the learning curve, i.e. the speed of learning, comparable between steps that
shape or filter differently; NaN for a run that did not log it), `final_entropy` (the last iterations' mean
token entropy), and the mean over iterations of each step's mechanism metric (the metric
its paper says the trick moves, e.g. DAPO's upper clip fraction for clip-higher).
"""

from __future__ import annotations

import math
import pathlib

import numpy as np

from rljax.analysis.runs import read_records
from rljax.ops.stats import pass_at_k
from rljax.train.run.heldout import PER_PROMPT_FILE

LAST = 5   # iterations averaged for "final" outcomes


def _mean(records, key, last=None) -> float:
  vals = [r[key] for r in records if isinstance(r.get(key), (int, float))
          and math.isfinite(r[key])]
  vals = vals[-last:] if last else vals
  return float(np.mean(vals)) if vals else float("nan")


def per_prompt_outcomes(run_dir, name=PER_PROMPT_FILE) -> dict:
  """{outcome: float [N]} from the run's `heldout_per_prompt.npz` (or a periodic
  evaluation's file `name`); {} without one."""
  path = pathlib.Path(run_dir) / name
  if not path.exists():
    return {}
  with np.load(path) as data:
    d = {k: data[k] for k in data.files}
  n, passk_n = int(d["eval_n"]), int(d["passk_n"])
  out = {"heldout_accuracy": d["after_greedy_correct"].astype(np.float64)}
  if n:
    out[f"heldout_avg@{n}"] = d["after_correct"] / n
  if passk_n and "after_passk_correct" in d:
    out[f"heldout_pass@{passk_n}"] = np.asarray(pass_at_k(passk_n, d["after_passk_correct"],
                                                          passk_n), np.float64)
  return out


def prompt_ids(run_dir, name=PER_PROMPT_FILE):
  """The held-out prompt ids the run's per-prompt outcomes are in the order of, int or str
  [N] (None without a per-prompt file)."""
  path = pathlib.Path(run_dir) / name
  if not path.exists():
    return None
  with np.load(path) as data:
    return data["prompt_id"] if "prompt_id" in data.files else None


def run_outcomes(run_dir, mechanisms=()) -> dict:
  """Every outcome of one run: per-prompt arrays and run-level floats."""
  records = read_records(run_dir)
  out = per_prompt_outcomes(run_dir)
  out["train_reward_auc"] = _mean(records, "train/sampled_score")
  out["final_entropy"] = _mean(records, "update/entropy", LAST)
  for key in mechanisms:
    out[key] = _mean(records, key)
  return out


def expected_outcomes(config, mechanisms=()) -> list:
  """The outcome names `run_outcomes` gives a run of `config` (before it runs)."""
  r = config.sampling
  names = ["heldout_accuracy"]
  if r.eval_n:
    names.append(f"heldout_avg@{r.eval_n}")
  if r.eval_passk_n and r.eval_passk_n > r.eval_n:
    names.append(f"heldout_pass@{r.eval_passk_n}")
  return names + ["train_reward_auc", "final_entropy", *mechanisms]


def start_diagnostics(run_dir) -> dict:
  """What the run started from (its first iteration samples the warm start): held-out
  greedy accuracy before RL, and the share of sampled completions in the task's worked
  mode and their accuracy."""
  records = read_records(run_dir)
  first = records[0] if records else {}
  before = pathlib.Path(run_dir) / PER_PROMPT_FILE
  greedy = float("nan")
  if before.exists():
    with np.load(before) as data:
      greedy = float(np.mean(data["before_greedy_correct"]))
  return {"heldout_accuracy_before": greedy,
          "worked_share": first.get("reward/worked", float("nan")),
          "worked_accuracy": first.get("train/worked_accuracy", float("nan")),
          "direct_accuracy": first.get("train/direct_accuracy", float("nan"))}


def periodic_iterations(run_dir) -> list:
  """The iterations after which the run saved a periodic per-prompt evaluation."""
  return sorted(int(p.stem.rsplit("_it", 1)[1])
                for p in pathlib.Path(run_dir).glob("heldout_per_prompt_it*.npz"))


def periodic_outcomes(run_dir, iteration) -> dict:
  """The per-prompt outcomes of the periodic evaluation after `iteration`."""
  return per_prompt_outcomes(run_dir, f"heldout_per_prompt_it{iteration}.npz")
