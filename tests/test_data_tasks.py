"""Synthetic tasks: demonstrations verify, splits disjoint, determinism, length budgets."""

import copy
import pickle

import numpy as np
import pytest

from rljax.data import TASKS, CharTokenizer, Prompt, make_task, parse_answer_tag
from rljax.data import countdown as cd

CASES = [("arithmetic", (1, 3), {}), ("arithmetic", 2, {"digits": 2}), ("countdown", (2, 3), {}),
         ("countdown", 4, {})]


@pytest.mark.parametrize("name,difficulty,options", CASES)
def test_demonstrations_score_full_and_fit_budgets(name, difficulty, options):
  task = make_task(name, difficulty=difficulty, seed=0, n_train=600, n_heldout=100, **options)
  tok = CharTokenizer()
  prompts = task.train_prompts() + task.heldout_prompts()
  assert len(task.train_prompts()) == 600 and len(task.heldout_prompts()) == 100
  for p in prompts:
    demo = task.demonstration(p)
    s = task.score(p, demo)
    assert (s.accuracy, s.format, s.total) == (1.0, 1.0, 1.1), (p, demo)
    p_ids, d_ids = tok.encode(p.text), tok.encode(demo)
    assert tok.decode(p_ids) == p.text and tok.decode(d_ids) == demo
    assert len(p_ids) <= task.max_prompt_len and len(d_ids) <= task.max_completion_len
    lo, hi = task.difficulty_range
    assert lo <= p.difficulty <= hi


@pytest.mark.parametrize("name", sorted(TASKS))
def test_heldout_disjoint_fixed_and_deterministic(name):
  a = make_task(name, difficulty=(2, 3), seed=0, n_train=2000)
  b = make_task(name, difficulty=(2, 3), seed=1, n_train=2000)
  a2 = make_task(name, difficulty=(2, 3), seed=0, n_train=2000)
  assert a.train_prompts() == a2.train_prompts()
  assert a.train_prompts() != b.train_prompts()
  assert a.heldout_prompts() == b.heldout_prompts()  # the held-out split ignores `seed`
  held = {p.text for p in a.heldout_prompts()}
  for t in (a, b):
    assert not held & {p.text for p in t.train_prompts()}
  assert len({p.id for p in a.train_prompts()}) == len(a.train_prompts())
  # Disjoint across difficulty ranges too: the split is a property of the problem.
  c = make_task(name, difficulty=2, seed=3, n_train=2000)
  assert not held & {p.text for p in c.train_prompts()}


def test_default_difficulty_sizes():
  """Sizes promised to the trainer at the recommended defaults."""
  a = make_task("arithmetic", difficulty=(1, 3), seed=0)
  c = make_task("countdown", difficulty=(2, 3), seed=0)
  assert (a.max_prompt_len, a.max_completion_len) == (10, 35)
  a2 = make_task("arithmetic", difficulty=(1, 3), seed=0, digits=2)
  assert (a2.max_prompt_len, a2.max_completion_len) == (14, 45)
  assert (c.max_prompt_len, c.max_completion_len) == (15, 39)
  assert CharTokenizer().vocab_size == 90


def test_arithmetic_golden_and_score_rules():
  task = make_task("arithmetic", difficulty=2, seed=0)
  p = Prompt(id="x", text="Q:23+45-17\n", answer="51", difficulty=2)
  assert task.demonstration(p) == "23+45=68\n68-17=51\n<answer>51</answer>"
  assert dict(task.score(p, "<answer>51</answer>")) == {"total": 1.1, "accuracy": 1.0,
                                                         "format": 1.0}
  assert task.score(p, "<answer> 51 </answer>\n").accuracy == 1.0
  assert dict(task.score(p, "<answer>52</answer>")) == {"total": 0.1, "accuracy": 0.0,
                                                         "format": 1.0}
  # First block counts; trailing text or a second block breaks the format.
  assert dict(task.score(p, "<answer>51</answer>x")) == {"total": 1.0, "accuracy": 1.0,
                                                          "format": 0.0}
  assert task.score(p, "<answer>52</answer><answer>51</answer>").accuracy == 0.0
  assert task.score(p, "51").total == 0.0 and task.score(p, "<answer>51").total == 0.0
  assert task.score(p, "<answer>5.1e1</answer>").accuracy == 0.0
  r = task.score(p, "<answer>51</answer>")
  assert copy.deepcopy(r) == r and pickle.loads(pickle.dumps(r)).accuracy == 1.0
  assert not hasattr(r, "missing")
  w = make_task("arithmetic", difficulty=2, seed=0, accuracy_weight=2.0, format_weight=0.0)
  assert w.score(p, "<answer>51</answer>").total == 2.0


def test_countdown_verifier_accepts_any_correct_expression():
  p = Prompt(id="x", text="N:3 5 7 T:56\n", answer="56", difficulty=2)
  assert cd.check(p, "(5+3)*7") and cd.check(p, "7*(3+5)") and cd.check(p, " (3 + 5) * 7 ")
  assert not cd.check(p, "8*7")  # 8 is not a given number
  assert not cd.check(p, "(5+3)*7+0")  # extra number
  assert not cd.check(p, "5*7+3")  # uses the numbers, wrong value
  assert not cd.check(p, "(5+3)*7*1")
  for bad in ["", "56", "(5+3)*7/1", "__import__('os')", "5**3", "-(3-5)*7", "(5+3)*", "9" * 99]:
    assert not cd.check(p, bad), bad
  task = make_task("countdown", difficulty=2, seed=0)
  assert task.demonstration(p) == "3+5=8\n8*7=56\n<answer>(3+5)*7</answer>"
  assert cd.fold_expression([2, 3, 4, 5], ["*", "+", "*"]) == "(2*3+4)*5"
  assert cd.fold_expression([2, 3, 4], ["-", "-"]) == "2-3-4"


def test_parse_answer_tag_and_errors():
  assert parse_answer_tag("a\n<answer>x</answer>\n") == ("x", True)
  assert parse_answer_tag("<answer>x</answer><answer>y</answer>") == ("x", False)
  assert parse_answer_tag("no tag") == (None, False)
  with pytest.raises(KeyError, match="valid names: \\['arithmetic', 'calculator', 'countdown'\\]"):
    make_task("sudoku", difficulty=1, seed=0)
  with pytest.raises(ValueError, match="difficulty"):
    make_task("arithmetic", difficulty=(3, 1), seed=0)
  with pytest.raises(ValueError, match="ops"):
    make_task("arithmetic", difficulty=1, seed=0, ops="*").train_prompts()


def test_rare_scratchpad_mixture_has_the_intended_share_at_every_level():
  task = make_task("arithmetic", difficulty=(1, 4), seed=0, scratchpad_fraction=0.15)
  prompts = task.train_prompts()
  worked = {p.id: not task.demonstration(p).startswith("<answer>") for p in prompts}
  assert abs(np.mean(list(worked.values())) - 0.15) < 0.02
  for level in range(1, 5):
    share = np.mean([worked[p.id] for p in prompts if p.difficulty == level])
    assert 0.10 < share < 0.20, (level, share)
  for p in prompts[:200]:
    demo, full = task.demonstration(p), task.demonstration(p, worked=True)
    assert full.endswith(f"<answer>{p.answer}</answer>") and "=" in full
    # the answer-only demo is exactly the tag; the worked one is today's scratchpad
    assert demo in (full, f"<answer>{p.answer}</answer>")
    assert task.score(p, demo)["accuracy"] == 1.0
  # fixed per prompt: the same prompt text gets the same mode in another task object
  again = make_task("arithmetic", difficulty=(1, 4), seed=0, scratchpad_fraction=0.15)
  assert all(again.demonstration(p) == task.demonstration(p) for p in prompts[:200])


def test_scratchpad_fraction_one_is_the_all_scratchpad_task():
  old = make_task("arithmetic", difficulty=(1, 3), seed=0)
  new = make_task("arithmetic", difficulty=(1, 3), seed=0, scratchpad_fraction=1.0)
  none = make_task("arithmetic", difficulty=(1, 3), seed=0, scratchpad_fraction=0.0)
  for p in old.train_prompts()[:100]:
    assert old.demonstration(p) == new.demonstration(p) == old.demonstration(p, worked=True)
    assert none.demonstration(p) == f"<answer>{p.answer}</answer>"
