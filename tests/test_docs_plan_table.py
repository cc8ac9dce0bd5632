"""docs/scale/plan_table.py builds docs/scale.md's table from saved `rljax plan --json`
outputs (`--cache DIR --cached-only`): nothing is compiled."""

import importlib.util
import json
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _module():
  spec = importlib.util.spec_from_file_location("plan_table", ROOT / "docs/scale/plan_table.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _program(name, fits, total):
  return {"name": name, "fits": fits, "compile_s": 12.3, "hbm_bytes": 16e9,
          "per_chip_bytes": {"total": total}}


def test_table_from_cached_plans_only(tmp_path, capsys):
  table = _module()
  label, _, topology, overrides = table.ROWS[0]
  plan = {"chips": 64, "mesh": {"data": 1, "fsdp": 64, "tensor": 1}, "fits": False,
          "iteration": {"roofline_s": 129.9, "update_mfu": 0.5},
          "programs": [_program("prefill", True, 12.9e9), _program("update", False, 20e9)]}
  (tmp_path / table.row_name(label, topology, overrides)).write_text(
      "[progress]\n" + json.dumps(plan) + "\n")
  table.main(["--cache", str(tmp_path), "--cached-only"])
  out = capsys.readouterr().out.splitlines()
  rows = out[2:-1]   # after the header and its rule, before the RESULT line
  assert rows[0] == (f"| {label} | {topology} (64 chips, 64 fsdp) | prefill | yes "
                     "| 12.9 / 16.0 | 12 | 130 s | 50% |")
  assert rows[1] == "|  |  | update | **no** | 20.0 / 16.0 | 12 |  |  |"
  assert len(rows) == 2   # rows without a saved plan are left out
  result = json.loads(out[-1].removeprefix("RESULT "))
  assert result == {"metric": "plan_table", "rows": 1, "fit": 0, "compile_s": 24.6}
