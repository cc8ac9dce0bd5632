"""Entropy-performance law R = -a exp(H) + b (Cui et al. 2025, arXiv:2505.22617, Eq. 1)."""

import numpy as np
import pytest

from rljax.analysis.entropy_law import fit_entropy_law, fit_run


def test_recovers_the_coefficients_of_an_exact_law_and_predicts_the_rest():
  h = np.linspace(1.2, 0.05, 60)            # entropy falls over the run
  r = -0.4 * np.exp(h) + 1.3
  fit = fit_entropy_law(h, r, fit_fraction=1 / 3, tail=5)
  assert fit.fit_points == 20
  np.testing.assert_allclose([fit.a, fit.b], [0.4, 1.3], atol=1e-9)
  np.testing.assert_allclose(fit.ceiling, 0.9, atol=1e-9)
  # the last 5 points were never fitted, yet the law predicts them
  np.testing.assert_allclose(fit.predicted_final, np.mean(r[-5:]), atol=1e-9)
  np.testing.assert_allclose(fit.actual_final, np.mean(r[-5:]), atol=1e-12)


def test_noisy_fit_equals_polyfit_in_exp_entropy():
  rng = np.random.default_rng(0)
  h = np.linspace(0.9, 0.1, 45) + rng.normal(0, 0.02, 45)
  r = -0.3 * np.exp(h) + 1.0 + rng.normal(0, 0.03, 45)
  fit = fit_entropy_law(h, r)
  slope, intercept = np.polyfit(np.exp(h[:15]), r[:15], 1)
  np.testing.assert_allclose([fit.a, fit.b], [-slope, intercept], rtol=1e-8)
  resid = r[:15] - (slope * np.exp(h[:15]) + intercept)
  np.testing.assert_allclose(fit.rmse_fit, np.sqrt(np.mean(resid ** 2)), rtol=1e-8)


def test_a_run_that_beats_its_prediction_shows_it():
  h = np.concatenate([np.linspace(1.0, 0.3, 20), np.full(20, 0.3)])
  r = -0.5 * np.exp(h) + 1.2
  r[-5:] += 0.1                               # a late gain the law does not explain
  fit = fit_entropy_law(h, r, fit_fraction=0.5)
  assert fit.actual_final - fit.predicted_final == pytest.approx(0.1, abs=1e-9)


def test_bad_inputs_are_refused_and_runs_without_signal_give_none():
  with pytest.raises(ValueError, match="equal length"):
    fit_entropy_law([0.1, 0.2], [1.0])
  with pytest.raises(ValueError, match="constant"):
    fit_entropy_law(np.full(12, 0.5), np.linspace(0, 1, 12))
  records = [{"update/entropy": 0.5, "train/accuracy": 0.1 * i} for i in range(12)]
  assert fit_run(records) is None
  records = [{"update/entropy": 1.0 - 0.05 * i, "train/accuracy": 0.05 * i} for i in range(12)]
  assert fit_run(records).fit_points == 4
