"""Every script in benchmarks/ runs end to end at its reduced shape (`--reduced`), in its own
subprocess as a user would run it, and its RESULT lines hold together: the schema
(`metric`, `rljax`, `peer`, `ratio`), the ratio equal to the quotient it states, the
configuration it echoes, and the FLOP counts worked by hand for the reduced model
(`workload.REDUCED_HF_CONFIG`: vocab 64, width 32, MLP 64, 2 layers, 2 query heads x 16,
1 KV head). Nothing here bounds a time: on a shared machine a time says nothing about
the code. `real_shapes.py` and `vs_tunix.py` have their own files."""

import importlib.util
import pathlib
import re

import pytest
from bench_runs import BENCH, run_bench

# The reduced model's per-layer matmul parameters: q, k, v, o and the three MLP projections
D, F, H, K, DH, V, LAYERS = 32, 64, 2, 1, 16, 64, 2
PER_LAYER = D * H * DH + 2 * D * K * DH + H * DH * D + 3 * D * F   # 9,216
MATMUL_PARAMS = LAYERS * PER_LAYER + D * V                         # 20,480 (untied lm head)


def test_every_script_has_a_reduced_run_in_ci():
  """Each script of benchmarks/ (a file with a `__main__` block; `workload.py` and
  `tunix_side.py` are modules) takes `--reduced` and some test runs it that way through
  `run_bench`."""
  scripts = {p.name for p in BENCH.glob("*.py") if '__name__ == "__main__"' in p.read_text()}
  assert {"sampler_vs_hf.py", "vs_tunix.py"} <= scripts and "workload.py" not in scripts
  tests = "".join(p.read_text() for p in pathlib.Path(__file__).parent.glob("test_*.py"))
  run = set(re.findall(r'run_bench\(\s*"(\w+\.py)",\s*"--reduced"', tests))
  assert scripts - run == set(), "benchmarks without a --reduced run in CI"
  for name in scripts:
    assert '"--reduced"' in (BENCH / name).read_text(), name


def _close(a, b, rel=2e-3):
  return a == pytest.approx(b, rel=rel)


def test_sampler_vs_hf():
  r = run_bench("sampler_vs_hf.py", "--reduced")["tokens_per_s_batch4"]
  assert (r["reduced"], r["batch"], r["prompt_len"], r["new_tokens"], r["reps"]) == (
      True, 4, 8, 8, 3)
  assert (r["vocab_size"], r["hidden_size"], r["num_layers"]) == (V, D, LAYERS)
  assert _close(r["ratio"], r["rljax"] / r["peer"])   # tokens/s: HF time / rljax time
  assert r["rljax_min_max"][0] <= r["rljax"] <= r["rljax_min_max"][1]
  assert r["peer_min_max"][0] <= r["peer"] <= r["peer_min_max"][1]
  # 2·(matmul params) per position over 8 + 8 positions, causal attention 4·H·Dh·Σ ctx
  per_row = 2 * MATMUL_PARAMS * 16 + 4 * H * DH * LAYERS * sum(range(1, 17))
  assert _close(r["gflop_per_call"], 4 * per_row / 1e9)            # 2.761e-3
  gflops = r["gflop_per_call"] * r["rljax"] / (4 * 8)               # per call / s per call
  assert _close(r["rljax_roofline_fraction"], gflops / r["matmul_gflops"], rel=2e-2)
  assert r["rljax_cpu_devices"] == 1 and r["rljax_programs_compiled"] >= 1


def test_grpo_vs_trl():
  peer = "trl" if importlib.util.find_spec("trl") else "none"
  # glibc's allocator: the XLA flag of keep-freed would change the compilation cache's keys
  r = run_bench("grpo_vs_trl.py", "--reduced", "--peer", peer, "--host-memory", "glibc")[
      "grpo_step_seconds"]
  assert r["config"] == {"prompts": 2, "group": 2, "completions": 4, "prompt_len": 8,
                         "new_tokens": 8, "loss_agg": "seq_mean_token_mean",
                         "dtype": "float32 compute, float32 params"}
  assert (r["reduced"], r["reps"], r["warmup"]) == (True, 2, 1)
  assert r["completion_tokens_per_step"] == 2 * 2 * 8
  # two timed steps: the median is the mean, so the parts add up to the total
  assert _close(r["rljax"], r["rljax_generate"] + r["rljax_update"], rel=1e-2)
  assert r["rljax_min_max"][0] <= r["rljax"] <= r["rljax_min_max"][1]
  if peer == "none":
    assert r["peer"] is None and r["ratio"] is None and r["trl_version"] is None
  else:
    assert _close(r["ratio"], r["peer"] / r["rljax"])
    assert _close(r["ratio_train"], r["peer_train"] / r["rljax_update"])


def test_update_roofline():
  r = run_bench("update_roofline.py", "--reduced")["update_flop_utilisation"]
  assert r["shape"] == {"prompts": 2, "group": 2, "prompt_len": 8, "new_tokens": 8, "rows": 4,
                        "roofline_n": 256, "vocab_size": V, "hidden_size": D,
                        "num_layers": LAYERS}
  # fwd + bwd = 3x the forward's 2·M·K·N over 16 positions, full S² attention, lm head on 8
  dense = 2 * PER_LAYER * LAYERS * 16
  attention = LAYERS * 2 * (2 * 16 * 16 * H * DH)
  head = 2 * D * V * 8
  assert _close(r["update_gflop"], 3 * 4 * (dense + attention + head) / 1e9)   # 8.258e-3
  assert _close(r["update_gflops"], r["update_gflop"] / r["update_seconds"])
  assert _close(r["rljax"], r["update_gflops"] / r["peer"])
  assert _close(r["ratio"], r["rljax"] / r["target"])
  assert r["flags_update_fraction"] == {"baseline": r["rljax"]}
  assert r["update_compiles"] == 1


def test_scaling():
  r = run_bench("scaling.py", "--reduced")["iteration_seconds_scaling"]
  assert (r["reduced"], r["reps"], r["group"], r["prompt_len"]) == (True, 1, 2, 8)
  rows = {(t["varied"], t["prompts"], t["new_tokens"], t["width"]): t for t in r["table"]}
  assert set(rows) == {("batch", 1, 8, 32), ("batch", 2, 8, 32), ("length", 2, 8, 32),
                       ("width", 2, 8, 32)}
  base = rows[("batch", 2, 8, 32)]
  assert r["rljax"] == base["seconds"] == rows[("width", 2, 8, 32)]["seconds"]
  assert _close(base["gflop"], 2 * rows[("batch", 1, 8, 32)]["gflop"])   # FLOPs linear in rows


def test_profile_ops():
  r = run_bench("profile_ops.py", "--reduced")["profile_shares"]
  assert r["shape"] == {"layers": LAYERS, "width": D, "heads": H, "kv_heads": K,
                        "head_dim": DH, "intermediate": F, "vocab": V, "tied": 0,
                        "rope_theta": 1e4, "prompt_len": 8, "new_tokens": 8,
                        "update_rows": 4}
  assert r["what"] == ["decode2", "update"] and set(r["rljax"]) == {"decode2", "update"}
  for what, p in r["rljax"].items():
    assert sum(p["components"].values()) == pytest.approx(1.0, abs=2e-3), what
    assert "lm head matmul" in p["components"], what   # ops attributed to rljax functions


def test_bf16_matmul():
  r = run_bench("bf16_matmul.py", "--reduced")["bf16_speedup_1024"]
  assert r["cube"] == "cube 256" and r["reps"] == 3 and r["ratio"] is None
  assert r["shapes"]["cube 256"]["mkn"] == [256, 256, 256]
  jax_cube, torch_cube = r["shapes"]["cube 256"]["jax"], r["shapes"]["cube 256"]["torch"]
  assert _close(r["rljax"], jax_cube["bfloat16"] / jax_cube["float32"])
  assert _close(r["peer"], torch_cube["bfloat16"] / torch_cube["float32"])


def test_logprob_memory():
  r = run_bench("logprob_memory.py", "--reduced")["peak_bytes"]
  b, t, v = r["batch"], r["seq"], r["vocab"]
  assert (b, t, r["width"], v, r["chunk"], r["dtype"]) == (2, 64, 32, 1024, 16, "float32")
  assert _close(r["ratio"], r["peer"] / r["rljax"])
  assert r["peer"] >= b * t * v * 4 and r["forward"][0] >= b * t * v * 4   # full fp32 logits
  assert r["forward"][1] < b * t * v * 4                                   # chunked: never


def test_memory():
  r = run_bench("memory.py", "--reduced")["update_peak_bytes"]
  assert r["shape"] == {"vocab": 128, "width": 32, "mlp": 64, "layers": 2, "heads": 2,
                        "kv_heads": 1, "head_dim": 16, "batch": 4, "seq": 32, "prompt": 8,
                        "micro": 2}
  for row in r["rows"]:
    u = row["update"]
    assert u["peak"] == u["args"] + u["out"] + u["temp"] - u["alias"], row["name"]
  assert r["peer"] == r["rows"][0]["update"]["peak"] and r["peer_row"].startswith("baseline")
  assert r["rljax"] == r["rows"][1]["update"]["peak"] and r["rljax_row"].startswith("+ remat")
  assert _close(r["ratio"], r["peer"] / r["rljax"])


def test_packing():
  r = run_bench("packing.py", "--reduced")["update_tokens_per_s"]
  s = r["shape"]
  assert (s["rows"], s["prompt"], s["completion"], r["reps"]) == (8, 8, 32, 1)
  assert r["padded_tokens"] == 8 * (8 + 32) and r["rows_padded"] == 8
  assert 0 < r["real_tokens"] <= r["padded_tokens"] and r["rows_packed"] <= 8
  assert _close(r["mean_over_max_length"], r["real_tokens"] / r["padded_tokens"], rel=2e-2)
  assert _close(r["rljax"], r["real_tokens"] / r["packed_s_median"])
  assert _close(r["peer"], r["real_tokens"] / r["padded_s_median"])
  assert _close(r["ratio"], r["rljax"] / r["peer"])
  assert _close(*r["loss_packed_padded"], rel=1e-4)


def test_prefill_share():
  r = run_bench("prefill_share.py", "--reduced")["rollout_s_n16_prompt256"]
  assert (r["prompts"], r["n"], r["prompt_len"], r["new_tokens"], r["slots"], r["reps"]) == (
      2, 4, 16, 4, 4, 1)
  whole = r["details"]["static rollout"]
  assert (r["rljax"], r["peer"], r["ratio"]) == (whole["shared_s"], whole["per_row_s"],
                                                 whole["speedup"])
  for name, d in r["details"].items():
    assert _close(d["speedup"], d["per_row_s"] / d["shared_s"]), name
  assert r["prefill_ratio"] == r["details"]["prefill (1 new token)"]["speedup"]


def test_rollout_longtail():
  r = run_bench("rollout_longtail.py", "--reduced")["completed_tokens_per_s_longtail"]
  assert (r["prompts"], r["samples"], r["new_tokens"], r["stop_tokens"], r["reps"]) == (
      2, 4, 32, 4, 1)
  assert r["requests"] == r["slots"] == 8 and r["same_lengths_static_continuous"]
  assert 1 <= r["length_max"] <= 32
  assert _close(r["max_over_mean"], r["length_max"] / r["length_mean"], rel=1e-2)
  assert _close(r["ratio"], r["rljax"] / r["peer"])
  assert _close(r["ratio_vs_hf"], r["rljax"] / r["hf"])


def test_async_sim():
  r = run_bench("async_sim.py", "--reduced")["async_throughput_gain"]
  assert (r["iterations"], r["batch"], r["devices"], r["staleness"]) == (10, 8, 8, [0, 1, 2, 4])
  assert _close(r["ratio"], r["rljax"] / r["peer"], rel=1e-2) and r["ratio"] >= 1.0


def test_moe_dispatch():
  r = run_bench("moe_dispatch.py", "--reduced")["moe_dispatch_step_s"]
  assert (r["tokens"], r["width"], r["experts"], r["expert_axis"], r["reps"]) == (64, 16, 4, 4, 1)
  assert set(r["steps_s"]) == {"unsharded", "jit", "all_gather", "all_to_all"}
  assert (r["rljax"], r["peer"]) == (r["steps_s"]["all_to_all"], r["steps_s"]["unsharded"])
  assert _close(r["ratio"], r["peer"] / r["rljax"])
  # the shard_map dispatches communicate; the unsharded block does not
  assert sum(r["collectives"]["unsharded"].values()) == 0
  assert r["collectives"]["all_to_all"]["all-to-all"] > 0
  assert r["collectives"]["all_gather"]["all-gather"] > 0


def test_scan_layers_decode():
  """Both layouts generate the reduced workload; the ratio is the median of per-round
  ratios, so it lies within the spread of single-round quotients, not necessarily equal to
  the quotient of the medians."""
  r = run_bench("scan_layers_decode.py", "--reduced")["decode_scanned_over_per_layer"]
  assert (r["reduced"], r["batch"], r["devices"], r["reps"]) == (True, 4, 1, 3)
  assert r["rljax"] > 0 and r["peer"] > 0 and r["ratio"] > 0
  assert r["scanned_ms"] == pytest.approx(1e3 * r["rljax"], abs=0.06)


def test_decode_segments():
  out = run_bench("decode_segments.py", "--reduced")
  for sampler in ("static", "continuous"):
    r = out[f"decode_seconds_{sampler}"]
    assert (r["batch"], r["prompt_len"], r["new_tokens"], r["stop_tokens"], r["reps"],
            r["rounds"], r["reduced"]) == (2, 8, 32, 4, 1, 1, True)
    assert _close(r["ratio"], r["peer"] / r["rljax"])
    # 31 decode steps are too few to split (`segment_ends`): one loop either way
    assert r["segments_rule"] == r["segments_always"] == 1
    assert r["same_lengths"] and 1 <= r["length_mean"] <= r["length_max"] <= 32
    assert set(r["rss_mb"]) == set(r["compile_s"]) == {"rule", "always"}
    assert r["compare"] == "segments"
    assert r["drain_sizes"] == ({"rule": None, "always": None} if sampler == "static"
                                else {"rule": [], "always": []})   # 2 rows: no 1-slot level


def test_decode_segments_drain():
  """--compare drain: 2 rows resident; their drain level of 1 slot runs only when
  MIN_DRAIN_SLOTS is 1 (the other choice)."""
  r = run_bench("decode_segments.py", "--reduced", "--compare", "drain",
                "--samplers", "continuous")["decode_seconds_continuous"]
  assert r["compare"] == "drain" and r["reduced"]
  assert r["drain_sizes"] == {"rule": [], "always": [1]}
  assert _close(r["ratio"], r["peer"] / r["rljax"])
  assert r["same_lengths"] and 1 <= r["length_max"] <= 32
