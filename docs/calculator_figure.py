"""Draws docs/calculator_curves.png from three seeds of the calculator task.

    for s in 0 1 2; do rljax train --config experiments/calculator.py \
      --config.run.seed=$s --config.run.dir=runs/final_calc_seed$s; done
    python docs/calculator_figure.py runs/final_calc_seed0 runs/final_calc_seed1 runs/final_calc_seed2
"""

import json
import pathlib
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from rljax.analysis.runs import read_records, series  # noqa: E402

PANELS = (("train accuracy", "train/accuracy"), ("tool calls per episode", "tools/calls_per_episode"),
          ("sampled tokens per episode", "tokens/sampled_per_episode"),
          ("entropy", "update/entropy"))


def main(run_dirs, out="docs/calculator_curves.png"):
  fig, axes = plt.subplots(1, len(PANELS) + 1, figsize=(4 * (len(PANELS) + 1), 3.2))
  for seed, run_dir in enumerate(run_dirs):
    records = read_records(run_dir)
    for ax, (title, key) in zip(axes, PANELS):
      x, y = series(records, key)
      ax.plot(x, y, label=f"seed {seed}", alpha=0.8)
      ax.set_title(title)
      ax.set_xlabel("iteration")
    result = json.loads((pathlib.Path(run_dir) / "result.json").read_text())
    axes[-1].plot([0, 1], [result["heldout_acc_before"], result["heldout_acc_after"]], "o-",
                  label=f"seed {seed}")
  axes[-1].set_xticks([0, 1], ["SFT start", "after RL"])
  axes[-1].set_title("held-out greedy accuracy")
  axes[0].legend()
  fig.tight_layout()
  fig.savefig(out, dpi=110)
  print(out)


if __name__ == "__main__":
  main(sys.argv[1:])
