"""Fuzz: verifiers never crash on arbitrary model output (issue: runs that survive)."""

import math

import hypothesis.strategies as st
from hypothesis import given, settings

from rljax.data import make_task
from rljax.data.tasks import parse_answer_tag
from rljax.rewards.math import extract_answer, is_equivalent

FRAGMENTS = st.sampled_from([
    "\\boxed{", "}", "\\frac{1}{2}", "<answer>", "</answer>", "%", "π", "3.14", "1e-3", "元",
    "{", "\\sqrt", "x^2", "-", ",", "(", ")", "=", " ", "\n", "\\", "$", "1/0", "nan", "∞",
])
TEXT = st.lists(st.one_of(FRAGMENTS, st.text(max_size=6)), max_size=8).map("".join)


@settings(max_examples=60, deadline=None)
@given(TEXT, TEXT)
def test_is_equivalent_never_raises(prediction, truth):
  assert is_equivalent(prediction, truth) in (True, False)
  assert isinstance(extract_answer(prediction), str)


TASK = make_task("arithmetic", difficulty=(1, 3), seed=0, n_train=8, n_heldout=4)
COUNTDOWN = make_task("countdown", difficulty=(2, 3), seed=0, n_train=8, n_heldout=4)


@settings(max_examples=80, deadline=None)
@given(TEXT)
def test_task_scores_are_finite_and_bounded(completion):
  for task in (TASK, COUNTDOWN):
    r = task.score(task.train_prompts()[0], completion)
    assert r["accuracy"] in (0.0, 1.0) and r["format"] in (0.0, 1.0)
    assert math.isfinite(r["total"])
  content, ok = parse_answer_tag(completion)
  assert content is None or isinstance(content, str)
