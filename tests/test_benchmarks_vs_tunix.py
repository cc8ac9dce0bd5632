"""benchmarks/vs_tunix.py: its checks in-process (always), and `--reduced` end to end in a
subprocess where Tunix can be imported (CI installs it, .ci/run): the RESULT schema, each
ratio the quotient it states, the configuration echoed, never a time."""

import importlib.util
import sys

import pytest
from bench_runs import BENCH, run_bench

sys.path.insert(0, str(BENCH))

import vs_tunix  # noqa: E402

TUNIX_MODULES = ("tunix.generate.sampler", "tunix.models.qwen2.params", "tunix.rl.rl_cluster",
                 "tunix.rl.grpo.grpo_learner")


def _tunix_missing() -> str:
  try:
    for name in TUNIX_MODULES:
      if importlib.util.find_spec(name) is None:
        return f"{name} not found"
  except ImportError as err:
    return str(err)
  return ""


def test_different_weights_stop_the_run(capsys):
  same = {"rljax": {"logits_probe": [[0.1, -0.2]]}, "tunix": {"logits_probe": [[0.1, -0.2]]}}
  vs_tunix.check_probes(same)
  other = {"rljax": same["rljax"], "tunix": {"logits_probe": [[0.1, -0.19]]}}
  with pytest.raises(SystemExit) as err:
    vs_tunix.check_probes(other)
  assert err.value.code == 2 and "weights differ" in capsys.readouterr().out


def test_shapes():
  """toy = the shared workload (benchmarks/README.md), qwen25_05b = real_shapes.py's."""
  hf, p, n, batches, grpo = vs_tunix.SHAPES["toy"]
  assert (hf["hidden_size"], hf["num_hidden_layers"], p, n, batches, grpo) == (
      256, 4, 32, 96, (64, 8), (8, 8))
  hf, p, n, batches, grpo = vs_tunix.SHAPES["qwen25_05b"]
  assert (hf["hidden_size"], hf["num_hidden_layers"], hf["vocab_size"], p, n, batches) == (
      896, 24, 151_936, 64, 128, (8,))


@pytest.mark.skipif(bool(_tunix_missing()), reason=f"Tunix cannot be imported "
                    f"({_tunix_missing()}): pip install -e '.[tunix-losses]' && pip install "
                    "--no-deps google-tunix==0.1.7, as .ci/run does")
def test_reduced_run():
  res = run_bench("vs_tunix.py", "--reduced", "--rounds", "2")
  res.pop("_stdout")
  assert set(res) == {"sampler_seconds_batch4_static", "sampler_seconds_batch4_continuous",
                      "sampler_peak_rss_mb_batch4_static", "sampler_peak_rss_mb_batch4_continuous",
                      "grpo_iteration_seconds", "grpo_peak_rss_mb"}
  for r in res.values():
    assert r["shape"] == "reduced" and r["matmul_gflops"] > 0
    assert r["ratio"] == pytest.approx(r["peer"] / r["rljax"], rel=2e-3), r["metric"]
  for name in ("static", "continuous"):
    r = res[f"sampler_seconds_batch4_{name}"]
    assert (r["batch"], r["prompt_len"], r["new_tokens"], r["reps"]) == (4, 8, 8, 2)
    # two rounds of fresh workers, one call each: the pooled median is their mean
    assert r["rounds"] == 2 and len(r["rljax_round_medians"]) == 2
    assert r["rljax"] == pytest.approx(sum(r["rljax_round_medians"]) / 2, rel=2e-3)
    # the same weight bytes per decode step on both sides: GB/s x seconds agree
    assert r["rljax_weight_gb_per_s"] * r["rljax"] == pytest.approx(
        r["peer_weight_gb_per_s"] * r["peer"], rel=5e-3)
    assert r["weight_stream_gb_per_s"] is None   # probed at the 0.5B shape only
    assert r["rljax_tokens_per_s"] == pytest.approx(4 * 8 / r["rljax"], rel=2e-3)
    assert r["peer_tokens_per_s"] == pytest.approx(4 * 8 / r["peer"], rel=2e-3)
    assert r["rljax_min_max"][0] <= r["rljax"] <= r["rljax_min_max"][1]
    assert r["peer_min_max"][0] <= r["peer"] <= r["peer_min_max"][1]
  g = res["grpo_iteration_seconds"]
  assert g["config"] == {"prompts": 2, "group": 2, "completions": 4, "prompt_len": 8,
                         "new_tokens": 8, "loss_agg": "seq_mean_token_mean",
                         "dtype": "float32 compute, float32 params", "optimizer": "adamw",
                         "lr": 1e-5}
  assert g["completion_tokens"] == 4 * 8 and (g["reps"], g["warmup"]) == (2, 2)
  for part in ("generate", "update", "old_logp"):
    assert g[f"ratio_{part}"] == pytest.approx(g[f"peer_{part}"] / g[f"rljax_{part}"],
                                               rel=2e-3), part
  # two timed iterations: the median is the mean, so rljax's parts add up to its total
  # (Tunix's total also holds the hand-over between its rollout thread and its trainer)
  assert g["rljax"] == pytest.approx(g["rljax_generate"] + g["rljax_update"], rel=1e-2)
  assert g["peer"] >= (g["peer_generate"] + g["peer_update"]) * (1 - 1e-2)
  # Tunix compiles its sampler on its first two calls: after the 2 warm-up iterations, none
  assert g["peer_timed_compiles"] == 0
  assert len(g["peer_rss_after_steps_mb"]) == 4 and min(g["peer_rss_after_steps_mb"]) > 0
