"""pass@k curves: exact Fraction references, boundary relations, plot output."""

import math
from fractions import Fraction

import numpy as np
import pytest
from tolerances import assert_close_f32

from rljax.analysis import passk
from rljax.analysis.plots import plot_pass_at_k


def _exact_curve(counts, n):
  return [float(sum(1 - Fraction(math.comb(n - c, k), math.comb(n, k)) for c in counts)
                / len(counts)) for k in range(1, n + 1)]


def test_curve_matches_exact_fractions():
  counts = np.array([0, 1, 2, 5, 8, 3])
  # pass@k is 1 − a product of k rounded float32 factors: |error| ≲ (k + 1)·eps32, k ≤ 8
  assert_close_f32(passk.pass_at_k_curve(counts, 8), _exact_curve(counts, 8), ulps=32,
                   scale=1.0)


def test_curve_boundaries_and_monotone():
  rng = np.random.default_rng(0)
  n = 16
  counts = rng.integers(0, n + 1, 40)
  counts[:5] = 0
  curve = passk.pass_at_k_curve(counts, n)
  assert curve.shape == (n,)
  np.testing.assert_allclose(curve[0], np.mean(counts / n), rtol=1e-6)
  np.testing.assert_allclose(curve[-1], np.mean(counts > 0), rtol=1e-6)
  assert np.all(np.diff(curve) >= -1e-7)
  assert passk.avg_at_k(counts, n) == pytest.approx(np.mean(counts / n))


def test_counts_from_matrix_and_metrics_dict():
  correct = np.array([[1, 0, 0, 1], [0, 0, 0, 0], [1, 1, 1, 1]])
  counts, n = passk.correct_counts(correct)
  np.testing.assert_array_equal(counts, [2, 0, 4])
  metrics = passk.pass_at_k_metrics(counts, n, prefix="eval/")
  assert sorted(metrics) == ["eval/avg@4", "eval/pass@1", "eval/pass@2", "eval/pass@3",
                             "eval/pass@4"]
  assert_close_f32([metrics[f"eval/pass@{k}"] for k in range(1, 5)], _exact_curve([2, 0, 4], 4),
                   ulps=32, scale=1.0)   # float32 products vs exact fractions, as above
  record = {f"heldout_pass@{k}": metrics[f"eval/pass@{k}"] for k in (1, 2, 3, 4)}
  np.testing.assert_allclose(passk.curve_from_record(record),
                             passk.pass_at_k_curve(counts, n), atol=1e-7)


def test_per_prompt_n_limits_k():
  curve = passk.pass_at_k_curve([1, 2], [2, 4])
  assert curve.shape == (2,)
  np.testing.assert_allclose(curve[1], (1.0 + (1 - 1 / 6)) / 2, rtol=1e-6)
  with pytest.raises(ValueError):
    passk.pass_at_k_curve([1, 2], [2, 4], k_max=3)
  with pytest.raises(ValueError):
    passk.pass_at_k_curve([5], 4)


def test_plot_pass_at_k_writes_png(tmp_path):
  curves = {"a": passk.pass_at_k_curve([0, 1, 4], 4), "b": passk.pass_at_k_curve([2, 2, 2], 4)}
  path = plot_pass_at_k(curves, tmp_path / "sub" / "passk.png")
  assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 1000


def test_chunked_evaluation_equals_one_chunk(monkeypatch):
  counts = np.array([0, 1, 2, 5, 8, 3, 7])
  whole = passk.pass_at_k_curve(counts, 8)
  monkeypatch.setattr(passk, "_MAX_ELEMENTS", 150)  # 2 prompts per chunk, last one padded
  np.testing.assert_allclose(passk.pass_at_k_curve(counts, 8), whole, rtol=1e-6)
  assert_close_f32(whole, _exact_curve(counts, 8), ulps=32, scale=1.0)   # as above
