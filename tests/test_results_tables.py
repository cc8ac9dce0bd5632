"""The published DAPO numbers are re-derived: the tables in README.md and docs/results.md equal
what docs/results/make_tables.py prints from the committed report (docs/results/dapo.json),
and that report has the documented shape."""

import importlib.util
import json
import math
import pathlib

from rljax.analysis.verdicts import VERDICTS

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _make_tables():
  spec = importlib.util.spec_from_file_location("make_tables",
                                                ROOT / "docs" / "results" / "make_tables.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_the_docs_tables_equal_the_generated_ones():
  make_tables = _make_tables()
  generated = make_tables.tables(json.loads(make_tables.REPORT.read_text()),
                                 json.loads(make_tables.RUNS.read_text()))
  found = {}
  for path in make_tables.FILES:
    for name, text in make_tables.blocks(path.read_text()).items():
      assert name in generated, f"{path.name}: unknown block {name!r}"
      assert text == generated[name], (f"{path.name}: block {name!r} differs from "
                                       "`python docs/results/make_tables.py --write`")
      found[name] = path
  assert set(found) == set(generated), f"blocks in no file: {set(generated) - set(found)}"


def test_fill_replaces_only_the_blocks():
  make_tables = _make_tables()
  text = ("a\n<!-- make_tables: x -->\nold\n<!-- /make_tables -->\nb\n"
          "<!-- make_tables: y -->\n<!-- /make_tables -->\n")
  out = make_tables.fill(text, {"x": "| new |", "y": "two\nlines"})
  assert out == ("a\n<!-- make_tables: x -->\n| new |\n<!-- /make_tables -->\nb\n"
                 "<!-- make_tables: y -->\ntwo\nlines\n<!-- /make_tables -->\n")
  assert make_tables.blocks(out) == {"x": "| new |", "y": "two\nlines"}


def test_the_committed_report_has_the_documented_shape():
  report = json.loads((ROOT / "docs" / "results" / "dapo.json").read_text())
  assert set(report["provenance"]) >= {"commit", "jax", "cpu"}
  assert len(report["provenance"]["commit"]) >= 40 and "dirty" not in report["provenance"]["commit"]
  names = [s["name"] for s in report["steps"]]
  assert names[0] == "naive_grpo" and names[-1] == "naive_grpo@aa" and len(names) == 7
  for step in report["steps"][1:]:
    assert step["seeds"] == list(range(8))
    for key in ("effects_vs_previous", "effects_vs_first"):
      for e in step[key].values():
        assert {"mean", "ci_low", "ci_high", "verdict", "p", "p_adjusted", "family"} <= set(e)
        assert e["verdict"] in VERDICTS and e["family"] in ("primary", "exploratory")
        if e["family"] == "exploratory":   # unadjusted (NaN for a metric a step does not log)
          assert e["p_adjusted"] == e["p"] or (math.isnan(e["p"]) and math.isnan(e["p_adjusted"]))
  assert report["primary"]["steps"] == names[1:-1]
