"""The model x topology x program table of docs/scale.md, regenerated with `rljax plan`.

Each row is one `rljax plan --json` in its own process (compiling a 70B program takes GBs
of host memory and minutes; a crash or a timeout costs one row). Needs libtpu
(`pip install -e ".[tpu]"`); runs on any host.

    python docs/scale/plan_table.py                       # every row of docs/scale.md
    python docs/scale/plan_table.py --only qwen2.5-7b     # rows whose model matches
    python docs/scale/plan_table.py --list                # the rows, without compiling
    python docs/scale/plan_table.py --cache plans/        # keep each row's JSON; reuse it
    python docs/scale/plan_table.py --cache plans/ --cached-only   # the table from plans/

With `--cache DIR` each row's `rljax plan --json` is saved as DIR/<row>.json and a row whose
file exists is not compiled again (a long table can be filled over several runs, or from
plans run on a bigger host: `rljax plan ... --json > DIR/<row>.json`, names by `--list`).

It generates a table of docs/scale.md (not a benchmark: it times the compiler, no peer).
Prints the Markdown table, then `RESULT {"metric": "plan_table", "rows", "fit", "compile_s"}`.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]   # the repository: experiments/ are relative
GRPO_7B = "experiments/qwen25_7b_grpo_v5e.py"
DAPO_32B = "experiments/qwen25_32b_dapo_v5p.py"
MOE_30B = "experiments/qwen3_30b_a3b_grpo_v5p.py"
# (label, experiment, topology, overrides): the recipes on their slices and on the others
# users ask about, and the other presets with the 7B recipe's settings
ROWS = [
    ("qwen2.5-7b GRPO 4k", GRPO_7B, "v5e-64", {}),
    ("qwen2.5-7b GRPO 4k", GRPO_7B, "v5p-32", {"parallel.fsdp": 16}),
    ("qwen2.5-7b GRPO 4k", GRPO_7B, "v6e-64", {}),
    ("qwen2.5-32b DAPO 20k", DAPO_32B, "v5p-128", {}),
    ("qwen2.5-0.5b GRPO 4k", GRPO_7B, "v5e-16", {"model.hf_config": "qwen2.5-0.5b",
                                                  "parallel.fsdp": 16, "algo.microbatches": 1}),
    ("qwen2.5-1.5b GRPO 4k", GRPO_7B, "v5e-16", {"model.hf_config": "qwen2.5-1.5b",
                                                  "parallel.fsdp": 16, "algo.microbatches": 1}),
    ("qwen3-8b GRPO 4k", GRPO_7B, "v5p-32", {"model.hf_config": "qwen3-8b", "parallel.fsdp": 16}),
    ("llama-3.1-8b GRPO 4k", GRPO_7B, "v5p-32", {"model.hf_config": "llama-3.1-8b",
                                                  "parallel.fsdp": 16}),
    ("qwen3-32b GRPO 4k", GRPO_7B, "v5p-128", {"model.hf_config": "qwen3-32b"}),
    ("llama-3.1-70b GRPO 4k", GRPO_7B, "v5p-256", {"model.hf_config": "llama-3.1-70b",
                                                    "parallel.fsdp": 128}),
    ("qwen3-30b-a3b GRPO 4k, replay", MOE_30B, "v5p-64", {}),
]


def plan_row(experiment, topology, overrides, timeout):
  """The `--json` plan of one row (None on a crash or timeout) and its wall time."""
  cmd = [sys.executable, "-m", "rljax", "plan", "--config", experiment, "--topology", topology,
         "--json", "--search", "0", *[f"--config.{k}={v}" for k, v in overrides.items()]]
  t0 = time.perf_counter()
  try:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT)
  except subprocess.TimeoutExpired:
    return None, time.perf_counter() - t0
  lines = done.stdout.strip().splitlines()
  if done.returncode not in (0, 3) or not lines:
    print(f"# {topology} {overrides}: exit {done.returncode}: {done.stderr[-400:]}",
          file=sys.stderr)
    return None, time.perf_counter() - t0
  return json.loads(lines[-1]), time.perf_counter() - t0


def row_name(label, topology, overrides) -> str:
  """The file name of a row's plan in a `--cache` directory."""
  parts = [label, topology, *[f"{k}={v}" for k, v in overrides.items()]]
  return re.sub(r"[^\w.=-]+", "_", "_".join(parts)) + ".json"


def cached_row(cache, row, timeout, compile_missing: bool):
  """The plan of `row` from the `cache` directory, else compiled (and saved there)."""
  label, experiment, topology, overrides = row
  path = pathlib.Path(cache) / row_name(label, topology, overrides) if cache else None
  if path is not None and path.exists():
    return json.loads(path.read_text().strip().splitlines()[-1])
  if not compile_missing:
    return None
  plan, _ = plan_row(experiment, topology, overrides, timeout)
  if path is not None and plan is not None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(plan) + "\n")
  return plan


def _gb(x) -> str:
  return f"{x / 1e9:.1f}"


def table_rows(label, topology, plan) -> list[str]:
  """One Markdown line per program of `plan` (the iteration's figures on the first)."""
  if plan is None:
    return [f"| {label} | {topology} | - | (no plan: crashed or timed out) | | | | |"]
  it = plan["iteration"]
  mfu = "-" if it["update_mfu"] is None else f"{it['update_mfu']:.0%}"
  out = []
  for i, p in enumerate(plan["programs"]):
    head = (f"{label} | {topology} ({plan['chips']} chips, {plan['mesh']['fsdp']} fsdp)"
            if i == 0 else " | ")
    tail = f"{it['roofline_s']:.0f} s | {mfu}" if i == 0 and it["roofline_s"] else " | "
    fits = "yes" if p["fits"] else "**no**"
    out.append(f"| {head} | {p['name']} | {fits} | {_gb(p['per_chip_bytes']['total'])} "
               f"/ {_gb(p['hbm_bytes'])} | {p['compile_s']:.0f} | {tail} |")
  return out


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--only", default="", help="rows whose label contains this text")
  parser.add_argument("--timeout", type=float, default=3600, help="seconds per row")
  parser.add_argument("--list", action="store_true", help="print the rows, compile nothing")
  parser.add_argument("--cache", default="", help="directory of the rows' plan JSONs")
  parser.add_argument("--cached-only", action="store_true",
                      help="with --cache: rows without a saved plan are left out")
  args = parser.parse_args(argv)
  rows = [r for r in ROWS if args.only in r[0]]
  if args.list:
    for label, experiment, topology, overrides in rows:
      print(f"{row_name(label, topology, overrides)}: rljax plan --config {experiment} "
            f"--topology {topology} "
            + " ".join(f"--config.{k}={v}" for k, v in overrides.items()))
    return
  lines = ["| model, recipe | topology | program | fits | per-chip GB / HBM | compile s "
           "| iteration (roofline) | update MFU |", "|" + "---|" * 8]
  fit, compile_s = 0, 0.0
  planned = 0
  for row in rows:
    label, _, topology, _ = row
    plan = cached_row(args.cache, row, args.timeout, not args.cached_only)
    if plan is None and args.cached_only:
      continue
    planned += 1
    lines += table_rows(label, topology, plan)
    if plan is not None:
      fit += bool(plan["fits"])
      compile_s += sum(p["compile_s"] for p in plan["programs"])
    print(lines[-1], file=sys.stderr, flush=True)
  print("\n".join(lines))
  print("RESULT " + json.dumps({"metric": "plan_table", "rows": planned, "fit": fit,
                                "compile_s": round(compile_s, 1)}))


if __name__ == "__main__":
  main()
