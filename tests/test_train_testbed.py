"""The embedded default is a model organism for RL tricks (issue 14): from its rare-
scratchpad warm start the default regime moves the ratio off 1 (so clipping acts), RL
raises the reward within a few iterations, and overlong filtering takes truncated rows
out of the loss."""

import pytest
from train_micro import micro_config, read_records

from rljax.train.config import load_config
from rljax.train.loop import train

QUIET = {"run.eval_every": 0, "run.save_every": 0, "run.progress": False, "run.plots": False,
         "run.tensorboard": False, "task.heldout_size": 16, "sampling.eval_n": 1,
         "parallel.num_devices": 1}


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
  """The base config's own SFT start (1000 steps, no cache) and 8 RL iterations."""
  run_dir = tmp_path_factory.mktemp("testbed") / "grpo"
  config = load_config("experiments/grpo.py", {
      **QUIET, "run.dir": str(run_dir), "run.iterations": 8, "sft.cache_dir": ""})
  result = train(config)
  return config, result, read_records(run_dir)


@pytest.mark.slow
def test_default_regime_moves_the_ratio_and_clips(default_run):
  config, _, records = default_run
  assert config.algo.epochs * config.algo.minibatches >= 4
  first = records[0]   # one rollout batch, updated epochs x minibatches times
  assert first["update/approx_kl_old"] > 1e-4
  assert abs(first["update/ratio"] - 1.0) > 0 or first["update/approx_kl_old"] > 0
  assert first["update/clip_low"] + first["update/clip_high"] > 1e-3
  assert all(r["update/clip_low"] + r["update/clip_high"] < 0.2 for r in records)


@pytest.mark.slow
def test_rl_raises_train_reward_and_length_from_the_warm_start(default_run):
  """Greedy SFT answers tersely; RL promotes the rare scratchpad: reward and length rise."""
  _, result, records = default_run
  acc = [r["train/accuracy"] for r in records]
  length = [r["train/response_length_mean"] for r in records]
  assert sum(acc[-3:]) / 3 > sum(acc[:2]) / 2 + 0.15, acc
  assert sum(length[-3:]) / 3 > sum(length[:2]) / 2 + 5, length
  assert result["heldout_acc_before"] < 0.5   # the start is weak greedy ...
  assert result["heldout_pass@1_before"] >= 0.0


def test_one_update_per_rollout_leaves_the_ratio_at_one(tmp_path, monkeypatch):
  """The control: with epochs = minibatches = 1 the ratio is exactly 1 and nothing clips
  (why the earlier default could not show any clipping variant)."""
  from rljax.data import tasks

  def coin_score(self, prompt, completion):
    acc = float(hash((prompt.id, completion)) % 3 == 0)
    return tasks.RewardBreakdown(total=acc, accuracy=acc, format=0.0)

  monkeypatch.setattr(tasks.Task, "score", coin_score)
  runs = {}
  for updates, extra in (("one", {"algo.epochs": 1, "algo.minibatches": 1}), ("four", {})):
    config = micro_config("grpo", tmp_path / updates, **{"run.iterations": 1,
                                                         "optim.actor_lr": 1e-2, **extra})
    train(config)
    runs[updates] = read_records(tmp_path / updates / "grpo")[0]
  assert runs["one"]["update/approx_kl_old"] < 1e-10
  assert runs["one"]["update/clip_low"] == runs["one"]["update/clip_high"] == 0.0
  assert runs["four"]["update/approx_kl_old"] > 1e-6


@pytest.mark.parametrize("overlong_filter", [False, True])
def test_overlong_filtering_gives_truncated_rows_zero_loss_tokens(tmp_path, overlong_filter):
  """An untrained micro model rarely stops within 6 tokens: most rows are truncated."""
  config = micro_config("grpo", tmp_path, **{"sampling.max_new_tokens": 6,
                                             "algo.overlong_cache_len": 2,
                                             "algo.overlong_filter": overlong_filter})
  train(config)
  for r in read_records(tmp_path / "grpo"):
    assert r["train/truncated_frac"] > 0.5
    if overlong_filter:
      assert r["train/truncated_loss_tokens"] == 0
    else:   # every truncated row keeps all 6 tokens
      assert r["train/truncated_loss_tokens"] == pytest.approx(
          6 * r["train/truncated_frac"] * 16)
