"""notebooks/analysis.ipynb executes headless on a tiny fake run and writes its PNGs."""

import json
import pathlib
import sys

import numpy as np
import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "analysis.ipynb"
KERNEL = "rljax-nbtest"
ALGO = dict(policy_loss="ppo", ratio_level="token", eps_low=0.2, eps_high=0.2, dual_clip=0.0,
            ratio_cap=0.0, loss_agg="seq_mean_token_mean", high_entropy_fraction=0.0,
            psr_weight=1.0, nsr_weight=1.0, overlong_filter=False)


def _write_run(run_dir, *, seed, iterations=9, n=4):
  """A plausible metrics.jsonl (9 iterations: enough for the entropy-law fit) and
  result.json, as the trainer writes them."""
  rng = np.random.default_rng(seed)
  run_dir.mkdir(parents=True)
  lines = []
  for it in range(1, iterations + 1):
    record = {
        "iteration": it, "train/reward": 0.2 + 0.1 * it + 0.02 * rng.normal(),
        "train/accuracy": 0.2 + 0.1 * it, "update/entropy": 1.5 - 0.1 * it,
        "train/response_length_mean": 10.0 + it, "update/clip_high": 0.01 * it,
        "tokens/entropy_p10": 0.1, "tokens/entropy_p50": 0.8 - 0.05 * it,
        "tokens/entropy_p90": 2.0, "tokens/cov_logp_adv": 0.05 / it,
        "tokens/entropy_pos_adv": 0.7, "tokens/entropy_neg_adv": "nan",
    }
    if it % 2 == 0:
      record["eval/accuracy"] = 0.3 + 0.05 * it
    lines.append(json.dumps(record))
  (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
  counts = rng.integers(0, n + 1, 10)
  from rljax.analysis import pass_at_k_metrics
  result = {"heldout_acc_before": 0.2, "heldout_acc_after": 0.5, "wall_s": 1.0,
            **pass_at_k_metrics(counts, n, prefix="heldout_")}
  (run_dir / "result.json").write_text(json.dumps(result))
  return result


@pytest.fixture
def kernel_env(tmp_path, monkeypatch):
  """A kernel spec for *this* interpreter in a temp JUPYTER_PATH (works in a fresh venv,
  whatever kernels are or are not installed); the kernel inherits this environment."""
  spec_dir = tmp_path / "jupyter" / "kernels" / KERNEL
  spec_dir.mkdir(parents=True)
  (spec_dir / "kernel.json").write_text(json.dumps({
      "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
      "display_name": "rljax test kernel", "language": "python"}))
  monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
  monkeypatch.setenv("MPLBACKEND", "Agg")
  return tmp_path


def test_notebook_executes_and_writes_figures(kernel_env, monkeypatch):
  runs = kernel_env / "runs"
  _write_run(runs / "grpo_tiny", seed=0)
  ablation = runs / "ablate_demo"
  results = {}
  for i, (step, eps_high) in enumerate((("baseline", 0.2), ("clip_higher", 0.28))):
    r = _write_run(ablation / step, seed=i + 1)
    (ablation / step / "config.json").write_text(json.dumps({
        "algo": dict(ALGO, eps_high=eps_high), "sampling": {"max_new_tokens": 24}}))
    results[step] = {"heldout_acc_before": r["heldout_acc_before"],
                     "heldout_acc_after": r["heldout_acc_after"], "wall_s": 1.0}
  (ablation / "results.json").write_text(json.dumps(results))
  (ablation / "report.md").write_text(
      "# Ablation: demo\n\n| step | held-out acc after |\n|---|---|\n"
      "| baseline | 0.500 |\n| clip_higher | 0.500 |\n")
  out = kernel_env / "figures"
  monkeypatch.setenv("RLJAX_RUNS", f"{runs / 'grpo_tiny'},{ablation}")
  monkeypatch.setenv("RLJAX_NOTEBOOK_OUT", str(out))
  nb = nbformat.read(NOTEBOOK, as_version=4)
  client = nbclient.NotebookClient(nb, kernel_name=KERNEL, timeout=120,
                                   resources={"metadata": {"path": str(ROOT)}})
  client.execute()
  expected = {"curves.png", "token_stats.png", "ablation_ablate_demo.png", "pass_at_k.png",
              "impact_clip_higher.png", "impact_token_mean.png", "impact_entropy_mask.png",
              "impact_w_reinforce.png"}
  assert (out / "ablation_ablate_demo" / "impact_clip_higher.png").stat().st_size > 2000
  written = {p.name: p for p in out.glob("*.png")}
  assert expected <= set(written), sorted(written)
  for path in written.values():
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 2000
  text = "\n".join(str(o.get("text", "")) + str(o.get("data", {}).get("text/markdown", ""))
                   for cell in nb.cells if cell.cell_type == "code"
                   for o in cell.get("outputs", []))
  assert "3 run(s)" in text  # grpo_tiny + the two ablation steps
  assert "| clip_higher | 0.500 |" in text  # the ablation table was rendered
  assert "promotes" in text  # the trick-impact tables were rendered
  assert "### clip_higher vs baseline" in text  # and the ablation's, from config.json
