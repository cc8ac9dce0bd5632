"""The entropy-performance law of RL on language models, as a run diagnostic.

Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language
Models", arXiv:2505.22617, Eq. 1: across models and algorithms (no entropy intervention),

    R = −a · exp(H) + b

where H is the policy entropy and R the validation reward (here: training reward or
accuracy per iteration). Fitted on the first part of a run it predicts the rest from the
entropy alone, and R = b − a at H = 0 is the ceiling the run approaches once its entropy
has collapsed. A run that ends well above its prediction gained from something the
law does not see (e.g. an entropy intervention such as clip-higher); one well below it
lost reward to something else (truncation, a broken update).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class EntropyLawFit(NamedTuple):
  """Result of `fit_entropy_law`.

  Attributes:
    a, b: the fitted coefficients of R = −a·exp(H) + b.
    fit_points: number of (H, R) points the fit used.
    rmse_fit: root-mean-square error on the fitted points.
    predicted_final: mean of −a·exp(H_t) + b over the last `tail` points of the run.
    actual_final: mean reward of the same last points.
    ceiling: b − a, the predicted reward at zero entropy.
  """

  a: float
  b: float
  fit_points: int
  rmse_fit: float
  predicted_final: float
  actual_final: float
  ceiling: float


def fit_entropy_law(entropy, reward, *, fit_fraction=1 / 3, tail=5) -> EntropyLawFit:
  """Least-squares fit of R = −a·exp(H) + b on the first `fit_fraction` of a run.

  Linear least squares in x = exp(H) (Cui et al. fit the same two parameters); the final
  prediction uses the run's own late entropy, as the paper's Fig. 1 extrapolation does.

  Args:
    entropy: per-iteration policy entropy H_t (nats/token), float [N].
    reward: per-iteration reward R_t, float [N], same length.
    fit_fraction: share of the iterations (from the start) used for the fit.
    tail: number of last iterations averaged for the predicted and actual final reward.
  Returns:
    EntropyLawFit.
  Raises:
    ValueError: fewer than 3 points to fit, or an entropy that does not vary over them.
  """
  h = np.asarray(entropy, np.float64)
  r = np.asarray(reward, np.float64)
  if h.shape != r.shape or h.ndim != 1:
    raise ValueError(f"entropy and reward must be 1-D of equal length, got {h.shape}, {r.shape}")
  n_fit = max(int(round(len(h) * fit_fraction)), 3)
  if len(h) < n_fit:
    raise ValueError(f"need at least {n_fit} iterations to fit, got {len(h)}")
  x = np.exp(h[:n_fit])
  if np.ptp(x) <= 1e-12:
    raise ValueError("entropy is constant over the fitted iterations; the law cannot be fitted")
  design = np.stack([-x, np.ones_like(x)], axis=1)
  (a, b), *_ = np.linalg.lstsq(design, r[:n_fit], rcond=None)
  rmse = float(np.sqrt(np.mean((design @ np.array([a, b]) - r[:n_fit]) ** 2)))
  tail = max(1, min(tail, len(h)))
  predicted = float(np.mean(-a * np.exp(h[-tail:]) + b))
  return EntropyLawFit(a=float(a), b=float(b), fit_points=n_fit, rmse_fit=rmse,
                       predicted_final=predicted, actual_final=float(np.mean(r[-tail:])),
                       ceiling=float(b - a))


def fit_run(records, *, entropy_key="update/entropy", reward_key="train/accuracy", **kwargs):
  """`fit_entropy_law` on a run's metric records (rows of metrics.jsonl), or None when
  the run has too few points or a constant entropy."""
  pts = [(r[entropy_key], r[reward_key]) for r in records
         if isinstance(r.get(entropy_key), (int, float)) and
         isinstance(r.get(reward_key), (int, float))]
  if len(pts) < 6:
    return None
  h, rew = zip(*pts)
  try:
    return fit_entropy_law(h, rew, **kwargs)
  except ValueError:
    return None
