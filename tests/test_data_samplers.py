"""Samplers promise distributions: checked by exact expectation and chi-square tests."""

import json

import numpy as np
import pytest

from rljax.data import (
  CurriculumSampler,
  PrioritizedSampler,
  UniformSampler,
  curriculum_level_probs,
  make_sampler,
  make_task,
)

CHI2_CRIT_P001 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 9: 27.88}


def _chi2(counts, probs):
  expected = probs * counts.sum()
  return float(((counts - expected) ** 2 / expected).sum())


def test_uniform_visits_every_prompt_once_per_epoch_and_resumes():
  s = UniformSampler(10, seed=0)
  first = np.concatenate([s.sample(4) for _ in range(5)])  # two epochs
  assert np.bincount(first, minlength=10).tolist() == [2] * 10
  assert sorted(first[:10]) == list(range(10)) and list(first[:10]) != list(first[10:])
  state = s.state_dict()
  a = [s.sample(3) for _ in range(4)]
  s2 = UniformSampler(10, seed=123)
  s2.load_state_dict(state)
  assert all(np.array_equal(x, y) for x, y in zip(a, [s2.sample(3) for _ in range(4)]))


def test_curriculum_level_probs_golden():
  levels = np.array([1.0, 2.0, 3.0])
  w = np.exp(-np.array([0.0, 1.0, 4.0]) / (2 * 0.5 ** 2))
  np.testing.assert_allclose(curriculum_level_probs(levels, 0, ramp_steps=10, width=0.5),
                             w / w.sum())
  np.testing.assert_allclose(curriculum_level_probs(levels, 5, ramp_steps=10, width=0.5),
                             np.array([w[1], w[0], w[1]]) / (w[0] + 2 * w[1]))
  np.testing.assert_allclose(curriculum_level_probs(levels, 99, ramp_steps=10, width=0.5),
                             w[::-1] / w.sum())


def test_curriculum_sampling_matches_its_distribution_and_moves_easy_to_hard():
  diffs = [1] * 5 + [2] * 3 + [3] * 2
  s = CurriculumSampler(diffs, seed=0, ramp_steps=4, width=0.7)
  for step in (0, 2, 4):
    s.step = step
    probs = s.prompt_probs()
    counts = np.bincount(s.sample(20000), minlength=10)
    assert _chi2(counts, probs) < CHI2_CRIT_P001[9], (step, counts)
  means = [float(np.dot(s.prompt_probs(t), diffs)) for t in range(6)]
  assert all(a < b for a, b in zip(means[:4], means[1:5])) and means[4] == means[5]


def test_prioritized_probabilities_ema_and_floor():
  s = PrioritizedSampler(4, seed=0, floor=0.1, alpha=0.5)
  np.testing.assert_allclose(s.prompt_probs(), [0.25] * 4)  # unseen: s = 0
  s.update([0, 1, 2], [1.0, 0.5, 0.0])
  s.update([1], [1.0])  # EMA: 0.5 * 0.5 + 0.5 * 1.0 = 0.75
  np.testing.assert_allclose(s.success, [1.0, 0.75, 0.0, 0.0])
  w = np.array([0.1, 0.25, 1.0, 1.0])  # max(1 - s, floor): the solved prompt keeps the floor
  np.testing.assert_allclose(s.prompt_probs(), w / w.sum())
  counts = np.bincount(s.sample(20000), minlength=4)
  assert _chi2(counts, w / w.sum()) < CHI2_CRIT_P001[3]
  with pytest.raises(ValueError, match="not in"):
    s.update([0], [1.5])


def test_prioritized_state_round_trip_is_json_serialisable():
  s = PrioritizedSampler(6, seed=3)
  s.update([1, 2], [1.0, 0.5])
  s.sample(5)
  state = s.state_dict()
  blob = json.dumps({k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in state.items()})
  s2 = PrioritizedSampler(6, seed=99)
  s2.load_state_dict(json.loads(blob))
  for _ in range(3):
    np.testing.assert_array_equal(s.sample(7), s2.sample(7))
  np.testing.assert_array_equal(s.success, s2.success)


def test_make_sampler_registry():
  prompts = make_task("arithmetic", difficulty=(1, 3), seed=0, n_train=50).train_prompts()
  s = make_sampler("curriculum", prompts, seed=0, ramp_steps=10)
  assert {prompts[i].difficulty for i in s.sample(200)} <= {1, 2, 3}
  with pytest.raises(KeyError, match="valid names"):
    make_sampler("random", prompts, seed=0)
