"""benchmarks/real_shapes.py at a reduced shape (rljax vs HF `generate`; the TRL side is
skipped: importing and building its trainer alone takes longer than the rest), and the
configuration check that benchmarks/grpo_vs_trl.py and real_shapes.py share."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

BENCH = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

import grpo_vs_trl  # noqa: E402
import real_shapes  # noqa: E402

REDUCED = ["--layers", "2", "--width", "64", "--heads", "2", "--kv-heads", "1", "--head-dim",
           "32", "--intermediate", "128", "--vocab", "256", "--prompt-len", "8",
           "--new-tokens", "8", "--batch", "4", "--grpo-prompts", "2", "--group", "2",
           "--reps", "2", "--warmup", "1", "--threads", "1"]


def test_default_shape_is_qwen25_half_billion():
  """The default flags build Qwen2.5-0.5B's 494,032,768 parameters (its model card: 0.49B;
  embeddings 151,936 x 896 tied, 24 layers of 14,912,384, final norm 896)."""
  torch = pytest.importorskip("torch")
  import transformers

  with torch.device("meta"):
    model = transformers.Qwen2ForCausalLM(
        transformers.Qwen2Config(**real_shapes.hf_config(real_shapes.QWEN25_05B)))
  assert sum(p.numel() for p in model.parameters()) == 494_032_768
  per_layer = (896 * 896 + 896) + 2 * (896 * 128 + 128) + 896 * 896 + 3 * 896 * 4864 + 2 * 896
  assert 151_936 * 896 + 24 * per_layer + 896 == 494_032_768


def test_config_check_names_the_differing_field(capsys):
  a = {f: 1 for f in grpo_vs_trl.COMPARED}
  assert grpo_vs_trl.mismatches(a, dict(a)) == []
  b = dict(a, dtype="bfloat16 compute, float32 params", threads=2)
  assert grpo_vs_trl.mismatches(a, b) == ["dtype", "threads"]
  with pytest.raises(SystemExit) as err:
    grpo_vs_trl.check_configs({"rljax": a, "trl": b})
  assert err.value.code == 2
  out = capsys.readouterr().out
  assert "differ in dtype, threads" in out and "bfloat16" in out
  missing = {k: v for k, v in a.items() if k != "loss_agg"}
  assert grpo_vs_trl.mismatches(a, missing) == ["loss_agg"]


def _results(stdout: str) -> dict:
  rows = [json.loads(x[len("RESULT "):]) for x in stdout.splitlines() if x.startswith("RESULT ")]
  return {r["metric"]: r for r in rows}


@pytest.mark.slow
def test_reduced_shape_run():
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(
      [str(BENCH.parent), str(BENCH), os.environ.get("PYTHONPATH", "")]))
  proc = subprocess.run([sys.executable, str(BENCH / "real_shapes.py"), *REDUCED,
                         "--peers", "hf"], capture_output=True, text=True, env=env,
                        timeout=600)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  res = _results(proc.stdout)
  assert set(res) == {"sampler_seconds_static", "sampler_seconds_continuous",
                      "sampler_peak_rss_mb", "grpo_step_seconds", "update_roofline_fraction",
                      "grpo_peak_rss_mb"}
  for name in ("static", "continuous"):
    r = res[f"sampler_seconds_{name}"]
    assert 0 < r["rljax"] < 60 and 0 < r["peer"] < 60
    assert r["ratio"] == pytest.approx(r["peer"] / r["rljax"], rel=1e-2)
    assert r["rljax_tokens_per_s"] == pytest.approx(4 * 8 / r["rljax"], rel=1e-2)
    assert r["rljax_min_max"][0] <= r["rljax"] <= r["rljax_min_max"][1]
    assert r["threads"] == 1
  g = res["grpo_step_seconds"]
  assert g["peer"] is None and g["ratio"] is None   # TRL skipped
  assert 0 < g["rljax_update"] < g["rljax"] and 0 < g["rljax_generate"] < g["rljax"]
  u = res["update_roofline_fraction"]
  assert u["ratio"] == pytest.approx(u["rljax"] / u["peer"], rel=1e-2)
  assert 0 < u["ratio"] < 2 and u["peer"] > 1   # GFLOP/s of a 1024³ dot on any CPU
  assert u["update_compiles"] == 1   # the same shapes every step: no recompilation
  m = res["grpo_peak_rss_mb"]
  assert 100 < m["rljax"] < 20_000
  xla = m["rljax_xla_update"]
  assert xla["peak_mb"] == pytest.approx(
      xla["args_mb"] + xla["out_mb"] + xla["temp_mb"] - xla["alias_mb"], abs=0.2)
  s = res["sampler_peak_rss_mb"]
  assert 100 < s["rljax"] < 20_000 and 100 < s["peer"] < 20_000
