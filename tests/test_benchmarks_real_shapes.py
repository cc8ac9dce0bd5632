"""benchmarks/real_shapes.py at a reduced shape (rljax vs HF `generate`; the TRL side is
skipped: importing and building its trainer alone takes longer than the rest), and the
configuration check that benchmarks/grpo_vs_trl.py and real_shapes.py share."""

import sys

import pytest
from bench_runs import BENCH, run_bench

sys.path.insert(0, str(BENCH))

import grpo_vs_trl  # noqa: E402
import real_shapes  # noqa: E402


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


@pytest.mark.slow
def test_reduced_shape_run():
  """`--reduced` end to end against HF `generate` (TRL skipped): schema, configuration and
  arithmetic of every RESULT line, no time bounded."""
  res = run_bench("real_shapes.py", "--reduced", "--peers", "hf", "--threads", "1")
  res.pop("_stdout")
  assert set(res) == {"sampler_seconds_static", "sampler_seconds_continuous",
                      "sampler_peak_rss_mb_static", "sampler_peak_rss_mb_continuous",
                      "grpo_step_seconds", "update_roofline_fraction",
                      "grpo_peak_rss_mb"}
  shape = {"layers": 2, "width": 32, "heads": 2, "kv_heads": 1, "head_dim": 16,
           "intermediate": 64, "vocab": 64}
  for name in ("static", "continuous"):
    r = res[f"sampler_seconds_{name}"]
    assert r["shape"] == shape and (r["batch"], r["prompt_len"], r["new_tokens"]) == (4, 8, 8)
    assert r["reps"] == 2 and r["threads"] == 1
    assert r["ratio"] == pytest.approx(r["peer"] / r["rljax"], rel=2e-3)
    assert r["rljax_tokens_per_s"] == pytest.approx(4 * 8 / r["rljax"], rel=2e-3)
    assert r["peer_tokens_per_s"] == pytest.approx(4 * 8 / r["peer"], rel=2e-3)
    assert r["rljax_min_max"][0] <= r["rljax"] <= r["rljax_min_max"][1]
  g = res["grpo_step_seconds"]
  assert g["peer"] is None and g["ratio"] is None   # TRL skipped
  assert (g["completions"], g["new_tokens"], g["shape"]) == (4, 8, shape)
  # two timed steps: the median is the mean, so the parts add up to the total
  assert g["rljax"] == pytest.approx(g["rljax_generate"] + g["rljax_update"], rel=1e-2)
  u = res["update_roofline_fraction"]
  assert u["ratio"] == pytest.approx(u["rljax"] / u["peer"], rel=2e-3)
  assert u["rljax"] == pytest.approx(u["update_gflop"] / u["update_seconds"], rel=2e-3)
  # tied lm head, 8 prompt + 8 completion positions, 4 rows: fwd + bwd = 3x forward FLOPs
  per_layer = 32 * 32 + 2 * 32 * 16 + 32 * 32 + 3 * 32 * 64
  flops = 3 * 4 * (2 * 2 * per_layer * 16 + 2 * 2 * (2 * 16 * 16 * 2 * 16) + 2 * 32 * 64 * 8)
  assert u["update_gflop"] == pytest.approx(flops / 1e9, rel=2e-3)
  assert u["update_compiles"] == 1   # the same shapes every step: no recompilation
  m = res["grpo_peak_rss_mb"]
  assert 100 < m["rljax"] < 20_000
  xla = m["rljax_xla_update"]
  assert xla["peak_mb"] == pytest.approx(
      xla["args_mb"] + xla["out_mb"] + xla["temp_mb"] - xla["alias_mb"], abs=0.2)
  peers = set()
  for name in ("static", "continuous"):   # each sampler's own worker; one HF worker
    s = res[f"sampler_peak_rss_mb_{name}"]
    assert 100 < s["rljax"] < 20_000 and 100 < s["peer"] < 20_000
    assert s["ratio"] == pytest.approx(s["peer"] / s["rljax"], rel=2e-3)
    assert 0 < s["rljax_param_mb"] < s["rljax"]
    peers.add(s["peer"])
  assert len(peers) == 1
