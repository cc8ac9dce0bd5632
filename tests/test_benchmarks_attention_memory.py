"""benchmarks/attention_memory.py --reduced: the RESULT lines' schema (compiled, never run)."""

import json
import sys

from bench_runs import BENCH, run_bench

sys.path.insert(0, str(BENCH))

import attention_memory  # noqa: E402


def test_reduced_run_prints_one_result_per_path_and_length():
  stdout = run_bench("attention_memory.py", "--reduced", JAX_PLATFORMS="cpu")["_stdout"]
  rows = [json.loads(line[len("RESULT "):]) for line in stdout.splitlines()
          if line.startswith("RESULT ")]
  assert [(r["seq"], r["attention"]) for r in rows] == [
      (128, "xla"), (128, "chunked"), (256, "xla"), (256, "chunked")]   # splash: TPU only
  for r in rows:
    assert set(r) == {"metric", "rljax", "peer", "ratio", "target", "seq", "attention",
                      "arguments", "fits", "compile_s"}
    assert r["metric"] == "attention_temp_bytes" and r["target"] == "cpu"
    assert r["rljax"] > 0 and r["arguments"] > 0 and r["fits"] and r["compile_s"] >= 0
    xla = next(x for x in rows if x["seq"] == r["seq"] and x["attention"] == "xla")
    assert r["peer"] == xla["rljax"] and r["ratio"] == round(r["peer"] / r["rljax"], 3)


def test_a_refused_compile_names_its_temporaries():
  message = ("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO "
             "temporaries (180.76G) exceeds available HBM (95.74G).")
  assert attention_memory.refused_temp_bytes(message) == int(180.76 * 2 ** 30)
