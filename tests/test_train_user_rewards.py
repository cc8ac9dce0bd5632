"""Your own rewards and tasks through `rljax train`: task.reward_fns from a file, weights,
GDPO, containment of a raising function, task.name="python", and the shaping penalties."""

import subprocess
import sys

import numpy as np
import pytest
from tolerances import assert_close_f32, f32_atol
from train_micro import MICRO, micro_config, read_records

from rljax.data.python_task import PythonTask
from rljax.rewards.base import compose
from rljax.rewards.user import user_reward_terms
from rljax.train.config import ConfigError
from rljax.train.loop import train

REWARDS = '''
def digits(prompt, completion, answer):
  """Share of digits in the completion (deterministic in the text)."""
  return sum(ch.isdigit() for ch in completion) / max(len(completion), 1)


def length(prompts, completions, answers):
  return [len(c) / 24 for c in completions]
length.batched = True


def parts(prompt, completion, answer):
  return {"score": float(answer in completion), "has_eq": float("=" in completion)}


def picky(prompt, completion, answer):
  if "7" in completion:
    raise ValueError("no sevens")
  return 1.0
'''


@pytest.fixture
def reward_file(tmp_path):
  path = tmp_path / "my_rewards.py"
  path.write_text(REWARDS)
  return path


def test_reward_fns_are_called_with_text_and_answer_and_composed(reward_file):
  from rljax.data import Prompt

  terms = user_reward_terms([f"{reward_file}:digits", f"{reward_file}:length",
                             f"{reward_file}:parts", f"{reward_file}:picky"], [2.0, 0.5, 1, 1])
  assert [name for name, _, _ in terms] == ["digits", "length", "parts", "picky"]
  prompts = [Prompt("a", "Q:1+2\n", "3", 1), Prompt("b", "Q:3+4\n", "7", 1)]
  out = compose(terms, timeout=None)(prompts, ["12=3", "x7"])
  np.testing.assert_allclose(out.components["digits"], [0.75, 0.5])
  np.testing.assert_allclose(out.components["length"], [4 / 24, 2 / 24])
  np.testing.assert_allclose(out.components["parts"], [1.0, 1.0])
  np.testing.assert_allclose(out.components["parts/has_eq"], [1.0, 0.0])   # logged, unweighted
  np.testing.assert_allclose(out.components["picky"], [1.0, 0.0])           # contained
  assert [(f.component, f.prompt_id, f.kind) for f in out.failures] == [("picky", "b", "exception")]
  np.testing.assert_allclose(out.total, 2 * out.components["digits"] + 0.5 *
                             out.components["length"] + out.components["parts"]
                             + out.components["picky"], rtol=1e-6)


def test_a_failing_batched_reward_fails_every_sample_of_its_component(tmp_path):
  from rljax.data import Prompt

  path = tmp_path / "bad.py"
  path.write_text("def bad(p, c, a):\n  raise RuntimeError('down')\nbad.batched = True\n")
  out = compose(user_reward_terms([f"{path}:bad"]), timeout=None)(
      [Prompt("a", "x", "1", 1), Prompt("b", "y", "2", 1)], ["1", "2"])
  assert out.failure_counts == {"bad": 2}
  np.testing.assert_allclose(out.total, [0.0, 0.0])


@pytest.mark.parametrize("spec, message", [
    ("no_colon", "expected 'package.module:name'"),
    ("missing_file.py:f", "not found"),
    ("json:not_there", "has no attribute 'not_there'"),
])
def test_bad_specs_name_the_field(spec, message):
  with pytest.raises(ValueError, match=message) as err:
    user_reward_terms([spec])
  assert "task.reward_fns" in str(err.value)


def test_weights_must_match_the_functions(reward_file):
  with pytest.raises(ConfigError, match="task.reward_weights has 1 entries for 2"):
    micro_config("grpo", reward_file.parent, **{
        "task.reward_fns": [f"{reward_file}:digits", f"{reward_file}:length"],
        "task.reward_weights": [1.0]})


def test_train_logs_each_reward_and_their_weighted_sum(reward_file, tmp_path):
  config = micro_config("grpo", tmp_path, **{
      "task.reward_fns": [f"{reward_file}:digits", f"{reward_file}:length",
                          f"{reward_file}:picky"],
      "task.reward_weights": [2.0, 0.5, 1.0]})
  train(config)
  for r in read_records(tmp_path / "grpo"):
    # replace mode: the verifier is evaluated (metrics) but not in the score
    want = 2.0 * r["reward/digits"] + 0.5 * r["reward/length"] + r["reward/picky"]
    assert r["train/raw_score"] == pytest.approx(want, rel=1e-5)
    assert "reward/accuracy" in r and "train/accuracy" in r
    # the untrained model writes sevens: some samples fail, the run goes on
    assert r["train/reward_failures"] == round(16 * (1 - r["reward/picky"]))


def test_gdpo_advantages_equal_a_hand_computation(reward_file, tmp_path):
  config = micro_config("grpo", tmp_path, **{
      "task.reward_fns": [f"{reward_file}:digits", f"{reward_file}:length"],
      "task.reward_weights": [2.0, 0.5], "task.reward_fns_mode": "add",
      "algo.reward_aggregation": "normalize_then_sum", "algo.soft_overlong": True,
      "run.iterations": 1})
  train(config)
  batch = np.load(tmp_path / "grpo" / "analysis_batch.npz")
  r = batch["reward_components"]     # accuracy, format, digits, length, shaping
  w = np.array([1.0, config.task.format_weight, 2.0, 0.5, 1.0])
  assert r.shape == (16, 5)
  assert np.all(r[:, 4] <= 0) and np.any(r[:, 4] < 0)   # the soft overlong penalty
  g = r.reshape(4, 4, 5)
  std = g.std(axis=1, ddof=1, keepdims=True)
  per = (g - g.mean(axis=1, keepdims=True)) / (std + 1e-6)
  total = (per * w).sum(-1).reshape(-1)
  want = (total - total.mean()) / (total.std(ddof=1) + 1e-6)
  first = batch["advantages"][np.arange(16), 0]     # one advantage per row, on every token
  # the trainer's float32 group and batch normalisations vs float64: other summation orders
  assert_close_f32(first, want, ulps=64)


def test_missing_eos_penalty_lowers_the_reward_by_the_truncated_share(tmp_path):
  config = micro_config("grpo", tmp_path, **{"algo.missing_eos_penalty": 0.5})
  train(config)
  for r in read_records(tmp_path / "grpo"):
    assert r["train/truncated_frac"] > 0
    assert r["train/reward"] == pytest.approx(r["train/raw_score"] - 0.5 * r["train/truncated_frac"],
                                              abs=f32_atol(r["train/raw_score"], 0.5, ulps=16))


def test_repetition_penalty_only_lowers_the_reward(tmp_path):
  config = micro_config("grpo", tmp_path, **{"algo.repetition_penalty": 1.0,
                                             "algo.repetition_ngram": 1})
  train(config)
  for r in read_records(tmp_path / "grpo"):
    assert r["train/reward"] < r["train/raw_score"]   # 24 random tokens of ~100 repeat some


class _Task:
  def train_prompts(self):
    return ["a", {"prompt": "b", "answer": "B", "id": "p-b"}]

  def heldout_prompts(self):
    return [{"text": "c", "answer": "C"}]

  def score(self, prompt, completion):
    return {"score": 2.0, "accuracy": 1.0, "extra": 3} if prompt == "a" else 0.5


def test_python_task_wraps_strings_dicts_and_hands_them_back():
  task = PythonTask(_Task(), source="t:make")
  a, b = task.train_prompts()
  assert (a.text, a.answer, b.id, b.answer) == ("a", "", "p-b", "B")
  assert task.heldout_prompts()[0].text == "c"
  assert task.score(a, "x") == {"total": 2.0, "accuracy": 1.0, "format": 0.0, "extra": 3.0}
  assert task.score(b, "x") == {"total": 0.5, "accuracy": 0.5, "format": 0.0}
  with pytest.raises(ValueError, match="no demonstration"):
    task.demonstration(a)
  with pytest.raises(ValueError, match="has no train_prompts"):
    PythonTask(object(), source="t:make")


def test_user_task_trains_from_the_command_line(tmp_path):
  """The documented example: a task in examples/, a reward from the same file, `rljax train`."""
  overrides = dict(MICRO, **{"run.iterations": 1, "run.dir": str(tmp_path / "run")})
  args = [f"--config.{k}={v}" for k, v in overrides.items()]
  out = subprocess.run([sys.executable, "-m", "rljax", "train", "--config",
                        "experiments/user_task.py:gdpo", *args],
                       capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.strip().splitlines()[-1].startswith("RESULT ")
  record = read_records(tmp_path / "run")[0]
  assert {"reward/task", "reward/brevity", "reward/accuracy"} <= set(record)
