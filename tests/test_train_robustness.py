"""Failing reward functions, non-finite gradients, bad configs and signals during training."""

import json
import math
import os
import pathlib
import signal
import subprocess
import sys
import time

import hypothesis.strategies as st
import jax.numpy as jnp
import pytest
from hypothesis import given
from train_micro import MICRO, micro_config, read_records

from rljax.data import tasks
from rljax.rewards.base import RewardError
from rljax.train.config import ConfigError, apply_overrides, base_config, validate
from rljax.train.loop import train
from rljax.train.update import objective

REPO = pathlib.Path(__file__).parent.parent
_real_score = tasks.Task.score


def _failing_score(kind):
  """A task reward that fails (raise / hang / NaN) on every prompt whose id hash is even."""
  def score(self, prompt, completion):
    if int(prompt.id[-2:], 16) % 2 == 0:
      if kind == "raise":
        raise ZeroDivisionError("broken verifier")
      if kind == "hang":
        time.sleep(5)
      if kind == "nan":
        return tasks.RewardBreakdown(total=math.nan, accuracy=math.nan, format=math.nan)
    return _real_score(self, prompt, completion)
  return score


@pytest.mark.parametrize("kind", ["raise", "hang", "nan"])
def test_failing_reward_is_contained_and_counted(kind, tmp_path, monkeypatch, capsys):
  monkeypatch.setattr(tasks.Task, "score", _failing_score(kind))
  config = micro_config("grpo", tmp_path, **{"task.reward_timeout": 0.3, "run.iterations": 1,
                                             "task.heldout_size": 2, "sampling.eval_n": 1})
  train(config)
  record = read_records(tmp_path / "grpo")[0]
  assert record["train/reward_failures"] > 0
  assert math.isfinite(record["update/loss"]) and math.isfinite(record["train/reward"])
  out = capsys.readouterr().out
  expected = {"raise": "exception", "hang": "timeout", "nan": "non_finite"}[kind]
  assert "(first: prompt arithmetic-" in out and expected in out
  # each failing component (the verifier feeds `accuracy` and `format`) is named once, not
  # once per sample or per batch (training and both evaluations fail too)
  named = [line.split("'")[1] for line in out.splitlines() if line.startswith("[rljax] reward")]
  assert sorted(named) == sorted(set(named)) and record["train/reward_failures"] > len(named)


def test_failing_reward_can_stop_the_run(tmp_path, monkeypatch):
  monkeypatch.setattr(tasks.Task, "score", _failing_score("raise"))
  config = micro_config("grpo", tmp_path, **{"task.reward_on_failure": "raise"})
  with pytest.raises(RewardError, match="broken verifier"):
    train(config)


def test_non_finite_gradients_are_skipped_then_stop_the_run(tmp_path, monkeypatch):
  real = objective.policy_terms

  def poisoned(spec, logp, batch):
    loss, diag = real(spec, logp, batch)
    return loss * jnp.nan, diag

  # One good run saves checkpoint 1; then every update is non-finite. The counter counts
  # updates, so one update per rollout makes each iteration one step of it.
  one_update = {"algo.epochs": 1, "algo.minibatches": 1}
  config = micro_config("grpo", tmp_path, **{"run.iterations": 1, "run.save_every": 1},
                        **one_update)
  train(config)
  good = (tmp_path / "grpo" / "checkpoints" / "1").stat().st_mtime
  monkeypatch.setattr(objective, "policy_terms", poisoned)
  config = micro_config("grpo", tmp_path, **{"run.iterations": 6, "run.save_every": 1,
                                             "run.max_nonfinite_in_row": 2}, **one_update)
  with pytest.raises(FloatingPointError, match="run.max_nonfinite_in_row=2"):
    train(config)
  records = read_records(tmp_path / "grpo")
  assert [r["update/skipped"] for r in records] == [0.0, 1.0]
  assert records[-1]["update/skipped_total"] == 1
  ckpts = sorted(int(p.name) for p in (tmp_path / "grpo" / "checkpoints").iterdir()
                 if p.name.isdigit())
  assert ckpts[-1] == 1 and (tmp_path / "grpo" / "checkpoints" / "1").stat().st_mtime == good


def test_tokenizer_model_vocab_mismatch_is_a_clear_error(tmp_path):
  config = micro_config("grpo", tmp_path, **{"model.vocab_size": 10})
  with pytest.raises(ValueError, match="vocab"):
    train(config)
  assert not (tmp_path / "grpo").exists()     # nothing written


def test_sigterm_finishes_the_iteration_and_checkpoints(tmp_path):
  run_dir = tmp_path / "grpo"
  overrides = dict(MICRO, **{"run.iterations": 50, "run.save_every": 0, "run.dir": str(run_dir)})
  env = dict(os.environ, PYTHONPATH=str(REPO))
  proc = subprocess.Popen(
      [sys.executable, "-m", "rljax", "train", "--config", "experiments/grpo.py",
       *[f"--config.{k}={v}" for k, v in overrides.items()]],
      cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  deadline = time.time() + 900   # a generous cap: a loaded machine compiles slowly
  while not (run_dir / "metrics.jsonl").exists() and time.time() < deadline:
    time.sleep(0.2)
  proc.send_signal(signal.SIGTERM)
  out, _ = proc.communicate(timeout=900)
  assert proc.returncode == 0, out
  done = len(read_records(run_dir))
  assert 1 <= done < 50
  steps = [int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit()]
  assert max(steps) == done
  result_lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
  result = json.loads(result_lines[-1].removeprefix("RESULT "))
  assert result["iterations"] == done


FIELDS = {
    "algo.advantage": st.sampled_from(["grpo", "rloo", "gae", "nope", ""]),
    "algo.eps_low": st.floats(-1, 2, allow_nan=False),
    "algo.eps_high": st.floats(-1, 2, allow_nan=False),
    "algo.dual_clip": st.floats(-1, 5, allow_nan=False),
    "algo.loss_agg": st.sampled_from(["token_mean", "seq_mean_token_sum_norm", "x"]),
    "algo.minibatches": st.integers(-2, 9),
    "algo.microbatches": st.integers(-2, 9),
    "sampling.n": st.integers(-1, 9),
    "sampling.temperature": st.floats(-1, 3, allow_nan=False),
    "sampling.top_p": st.floats(-1, 2, allow_nan=False),
    "sampling.max_new_tokens": st.integers(-5, 600),
    "parallel.data": st.integers(-2, 9),
    "parallel.fsdp": st.integers(-2, 9),
    "algo.dynamic_sampling": st.booleans(),
    "algo.dynamic_sampling_max_rounds": st.integers(-2, 3),
}


@given(st.fixed_dictionaries({}, optional=FIELDS))
def test_random_configs_only_raise_config_errors(fields):
  c = base_config()
  apply_overrides(c, fields)
  try:
    validate(c, num_devices=8)
  except ConfigError as err:
    assert "invalid config" in str(err)


def _write_jsonl(path, rows):
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  return str(path)


def _arith_rows(n):
  rows = []
  for i in range(n):
    a, b = i % 10, (i * 7) % 10
    rows.append({"prompt": f"Q:{a}+{b}\n", "answer": str(a + b),
                 "solution": f"{a}+{b}={a + b}\n<answer>{a + b}</answer>"})
  return rows


def test_jsonl_task_runs_end_to_end(tmp_path):
  rows = [dict(r, prompt=r["prompt"].replace("Q:", f"Q{i}:")) for i, r in enumerate(_arith_rows(80))]
  path = _write_jsonl(tmp_path / "data.jsonl", rows)
  config = micro_config("grpo", tmp_path, **{"task.name": "jsonl", "task.jsonl_path": path,
                                             "sft.steps": 2, "run.iterations": 1})
  result = train(config)
  assert result["iterations"] == 1


@pytest.mark.parametrize("content,needle", [("", "empty"), ('{"prompt": "Q:1+1"}\n', "answer"),
                                            ("{not json\n", ":1")])
def test_bad_jsonl_files_are_clear_errors(tmp_path, content, needle):
  path = tmp_path / "bad.jsonl"
  path.write_text(content)
  config = micro_config("grpo", tmp_path, **{"task.name": "jsonl", "task.jsonl_path": str(path)})
  with pytest.raises(ValueError, match=needle):
    train(config)
  assert not (tmp_path / "grpo").exists()     # nothing written


def test_long_prompts_are_rejected_or_truncated(tmp_path):
  rows = [dict(r, prompt=f"Q{i}:" + r["prompt"][2:]) for i, r in enumerate(_arith_rows(60))]
  rows.append({"prompt": "Q:" + "1+" * 150 + "1\n", "answer": "151"})
  path = _write_jsonl(tmp_path / "long.jsonl", rows)
  fields = {"task.name": "jsonl", "task.jsonl_path": path, "run.iterations": 1,
            "model.max_position_embeddings": 128}
  with pytest.raises(ConfigError, match="task.long_prompts"):
    train(micro_config("grpo", tmp_path / "reject", **fields))
  result = train(micro_config("grpo", tmp_path / "truncate",
                              **dict(fields, **{"task.long_prompts": "truncate"})))
  assert result["iterations"] == 1
