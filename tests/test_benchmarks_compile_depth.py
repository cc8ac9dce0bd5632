"""benchmarks/compile_depth.py at tiny shapes: one RESULT line per (case, layout, platform)
with the documented fields (compile seconds are printed, never bounded here)."""

import json
import sys

import pytest
from bench_runs import BENCH, run_bench

sys.path.insert(0, str(BENCH))

import compile_depth  # noqa: E402

FIELDS = {"metric", "shape", "layers", "scan_layers", "platform", "devices", "seq", "rep", "lower_s",
          "compile_s", "total_s", "flops", "temp_bytes", "error", "load", "rljax", "peer", "ratio"}


def test_reduced_run_prints_one_result_per_compile():
  out = run_bench("compile_depth.py", "--reduced", "--cases", "reduced:1,reduced:2", "--seq",
                  "8", "--topology", "v5p:2x2x1")["_stdout"]
  rows = [json.loads(line[len("RESULT "):]) for line in out.splitlines()
          if line.startswith("RESULT ")]
  pairs = [r for r in rows if r["metric"] == "compile_s_per_layer_over_scanned"]
  rows = [r for r in rows if r["metric"] == "compile_s"]
  for pair in pairs:   # each pair's ratio is its two compiles' quotient
    scanned, per_layer = (next(r["compile_s"] for r in rows if r["platform"] == pair["platform"]
                               and r["layers"] == pair["layers"] and r["scan_layers"] == scan)
                          for scan in (True, False))
    assert (pair["rljax"], pair["peer"]) == (scanned, per_layer)
    assert pair["ratio"] == pytest.approx(per_layer / scanned)
  assert len(pairs) == len(rows) // 2
  tpu = [r for r in rows if r["platform"] != "cpu"]
  assert tpu or "skipped, no TPU compiler" in out   # AOT for TPU only with libtpu
  cpu = [r for r in rows if r["platform"] == "cpu"]
  assert [(r["layers"], r["scan_layers"]) for r in cpu] == [
      (1, True), (1, False), (2, True), (2, False)]
  for row in rows:
    assert set(row) == FIELDS, row
    assert row["metric"] == "compile_s" and row["shape"] == "reduced" and row["seq"] == 8
    assert row["rljax"] == row["compile_s"] and row["peer"] is None
    assert row["lower_s"] >= 0 and row["compile_s"] > 0 and row["total_s"] >= row["compile_s"]
    assert row["devices"] == (1 if row["platform"] == "cpu" else 4)
    assert row["error"] is None and row["temp_bytes"] > 0
  assert all(r["platform"] == "tpu:v5p:2x2x1" for r in tpu)


def test_cases_are_checked_by_name():
  assert compile_depth.parse_cases("qwen2.5-7b:4,llama-3.1-70b:80") == [
      ("qwen2.5-7b", 4), ("llama-3.1-70b", 80)]
  with pytest.raises(SystemExit, match="SHAPE:LAYERS"):
    compile_depth.parse_cases("qwen2.5-7b")
  with pytest.raises(SystemExit, match="--layouts"):
    compile_depth.parse_args(["--layouts", "stacked"])


def test_the_7b_and_70b_shapes_have_their_published_parameter_counts():
  """Qwen2.5-7B: 7,615,616,512 parameters (its model card: 7.61B), Llama-3.1-70B:
  70,553,706,496 (by hand from its config.json: 2·V·D untied embeddings + 80 layers of
  (2·D·H·Dh + 2·D·K·Dh + 3·D·F + 2·D) + the final norm D), from the abstract decoder."""
  import jax
  from flax import nnx

  from rljax.models import Decoder

  def count(shape, layers):
    model = nnx.eval_shape(lambda: Decoder(compile_depth.model_config(shape, layers, True),
                                           rngs=nnx.Rngs(0)))
    return sum(x.size for x in jax.tree.leaves(nnx.state(model)))
  assert count("qwen2.5-7b", 28) == 7_615_616_512
  d, f, h, k, dh, v = 8192, 28672, 64, 8, 128, 128256
  assert count("llama-3.1-70b", 80) == 2 * v * d + 80 * (
      2 * d * h * dh + 2 * d * k * dh + 3 * d * f + 2 * d) + d == 70_553_706_496
