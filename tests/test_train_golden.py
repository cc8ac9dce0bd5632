"""No silent change of behaviour: short runs reproduce the metrics recorded in
`tests/golden_metrics.json` (`tests/golden_runs.py` says how they were made and how to
re-record them after an intentional change)."""

import json

import pytest
from golden_runs import GOLDEN_PATH, SPECS, compare, cpu_fingerprint, run_spec

GOLDEN = json.loads(GOLDEN_PATH.read_text())


def test_golden_file_covers_every_spec():
  assert sorted(GOLDEN["runs"]) == sorted(SPECS)
  for run in GOLDEN["runs"].values():
    assert len(run["metrics"]) == 3
    # the regime acts: rewards vary within groups, so the updates move the policy
    assert sum(r["train/advantage_abs_mean"] > 0 for r in run["metrics"]) >= 2


@pytest.mark.slow
@pytest.mark.parametrize("spec", SPECS)
def test_short_run_reproduces_the_recorded_metrics(spec, tmp_path):
  if cpu_fingerprint() != GOLDEN["cpu"]:
    pytest.skip("golden metrics were recorded on another CPU (instruction set or model): "
                "its float rounding differs; re-record with `python tests/golden_runs.py --record`")
  actual = run_spec(spec, tmp_path)
  # 1e-6 relative: a restructuring that sums the same floats in another order passes
  differences = compare(GOLDEN["runs"][spec], actual, rtol=1e-6)
  assert not differences, "\n".join(differences[:20])
