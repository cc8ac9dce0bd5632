"""compose: weighted totals, per-component logging, failure containment; rule rewards."""

import time

import numpy as np
import pytest

from rljax.data import Prompt, make_task
from rljax.rewards import (
  RewardError,
  compose,
  format_reward,
  math_accuracy_reward,
  soft_overlong_reward,
  task_accuracy_reward,
)

P = [Prompt(id=f"p{i}", text="Q", answer=a, difficulty=1) for i, a in enumerate(["4.5", "96"])]
C = ["<answer>9/2</answer>", "盈利96%"]


def test_weighted_total_and_components_golden():
  scorer = compose([("acc", math_accuracy_reward, 1.0), ("fmt", format_reward, 0.5)])
  out = scorer(P, C)
  np.testing.assert_array_equal(out.components["acc"], [1.0, 1.0])
  np.testing.assert_array_equal(out.components["fmt"], [1.0, 0.0])
  np.testing.assert_allclose(out.total, [1.5, 1.0])
  assert out.failures == [] and out.failure_counts == {"acc": 0, "fmt": 0}


def _raises(prompt, completion):
  if prompt.id == "p1":
    raise ZeroDivisionError("boom")
  return 1.0


def _nan(prompt, completion):
  return float("nan") if prompt.id == "p0" else 2.0


def _hangs(prompt, completion):
  if prompt.id == "p0":
    time.sleep(3.0)
  return 1.0


def test_failures_are_contained_counted_and_reported():
  scorer = compose([("r", _raises, 1.0), ("n", _nan, 1.0), ("h", _hangs, 1.0),
                    ("fmt", format_reward, 1.0)], failure_score=-1.0, timeout=0.3)
  out = scorer(P, C)
  np.testing.assert_array_equal(out.components["r"], [1.0, -1.0])
  np.testing.assert_array_equal(out.components["n"], [-1.0, 2.0])
  np.testing.assert_array_equal(out.components["h"], [-1.0, 1.0])  # the hang only costs p0
  np.testing.assert_array_equal(out.components["fmt"], [1.0, 0.0])  # unaffected
  kinds = {(f.prompt_id, f.component, f.kind) for f in out.failures}
  assert kinds == {("p1", "r", "exception"), ("p0", "n", "non_finite"), ("p0", "h", "timeout")}
  assert out.failure_counts == {"r": 1, "n": 1, "h": 1, "fmt": 0}
  assert "ZeroDivisionError: boom" in [f.message for f in out.failures if f.kind == "exception"][0]
  assert scorer.abandoned_threads == 1
  np.testing.assert_allclose(out.total, [1 - 1 - 1 + 1, -1 + 2 + 1 + 0])


def test_raise_mode_names_prompt_and_component():
  scorer = compose([("r", _raises, 1.0)], on_failure="raise", timeout=None)
  with pytest.raises(RewardError, match="'r' failed on prompt 'p1'.*ZeroDivisionError"):
    scorer(P, C)
  with pytest.raises(ValueError, match="on_failure"):
    compose([("r", _raises, 1.0)], on_failure="ignore")
  with pytest.raises(ValueError, match="unique"):
    compose([("r", _raises, 1.0), ("r", _nan, 1.0)])


def test_soft_overlong_reward_matches_dapo_eq13():
  fn = soft_overlong_reward(max_len=10, cache_len=4)
  lengths = [0, 6, 7, 8, 10, 11, 50]
  expected = [0.0, 0.0, -0.25, -0.5, -1.0, -1.0, -1.0]  # (10-4-L)/4 on the ramp
  assert [fn(None, "x" * n) for n in lengths] == expected
  with pytest.raises(ValueError):
    soft_overlong_reward(max_len=4, cache_len=5)


def test_task_accuracy_reward_composes_with_task_verifier():
  task = make_task("arithmetic", difficulty=1, seed=0, n_train=8)
  prompts = task.train_prompts()[:4]
  completions = [task.demonstration(p) for p in prompts[:2]] + ["<answer>x</answer>", "7"]
  out = compose([("acc", task_accuracy_reward(task), 1.0), ("fmt", format_reward, 0.1)])(
    prompts, completions)
  np.testing.assert_array_equal(out.components["acc"], [1, 1, 0, 0])
  np.testing.assert_array_equal(out.components["fmt"], [1, 1, 1, 0])


def test_a_reward_that_is_not_a_number_is_a_contained_failure_named_once(capsys):
  """The string "0.5" is not a reward (float("0.5") would accept it silently), nor is a
  mapping without a numeric "score"; NumPy scalars and bools are numbers. Each sample fails
  and is counted; the failure is named once per process, not once per sample or batch."""
  from rljax.train.rollout.context import failure_lines

  scorer = compose([("text", lambda p, c: "0.5", 1.0),
                    ("dict", lambda p, c: {"score": "1", "len": 3.0}, 1.0),
                    ("nokey", lambda p, c: {"value": 1.0}, 1.0),
                    ("np", lambda p, c: np.float32(0.25), 1.0),
                    ("flag", lambda p, c: p.id == "p1", 1.0)], timeout=None)
  out = scorer(P, C)
  assert out.failure_counts == {"text": 2, "dict": 2, "nokey": 2, "np": 0, "flag": 0}
  assert {f.kind for f in out.failures} == {"not_a_number"}
  assert "returned str '0.5', not a number" in out.failures[0].message
  np.testing.assert_allclose(out.total, [0.25, 1.25])
  lines = failure_lines(out.failures, 2, scorer.reported)
  assert len(lines) == 3 and "'text' failed on 2 of 2 samples (first: prompt p0)" in lines[0]
  assert failure_lines(out.failures, 2, scorer.reported) == []   # the next batch: named
