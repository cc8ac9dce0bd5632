"""Rollouts that overlap the updates: the versions that sample each batch, the sampler on
its own devices, failures contained in the sampler thread."""

import jax
import pytest
from train_micro import micro_config, read_records, spy_versions

from rljax.data import tasks
from rljax.rewards.base import RewardError
from rljax.train.loop import train

SIGNAL = {"task.reward_fns": ["tests/signal_rewards.py:digit_share"], "run.iterations": 4}
VOLATILE = ("time/", "compile/", "sync/")


def _comparable(run_dir):
  return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)}
          for r in read_records(run_dir)]


@pytest.mark.parametrize("k", [1, 2])
def test_every_batch_is_sampled_by_version_t_minus_k(k, tmp_path, monkeypatch):
  seen = spy_versions(monkeypatch)
  config = micro_config("grpo", tmp_path, **SIGNAL, **{"sampling.max_staleness": k,
                                                       "parallel.num_devices": 1})
  train(config)
  assert [t for t, _, _ in seen] == [0, 1, 2, 3]
  for t, versions, _ in seen:
    assert (versions == max(0, t - k)).all(), (t, versions)
  records = read_records(tmp_path / "grpo")
  assert [r["staleness/max"] for r in records] == [float(min(t, k)) for t in range(4)]
  lag = f"staleness/lag{k}_logp_gap"
  assert records[-1][lag] > 0    # the stale policy really differs from the trainer's


def test_first_batch_is_the_synchronous_one_and_later_ones_differ(tmp_path):
  """k = 1 consumes the synchronous run's first batch (version 0 either way), then batches
  of the previous version: same first update, different later ones."""
  runs = {}
  for k in (0, 1):
    train(micro_config("grpo", tmp_path / f"k{k}", **SIGNAL, **{"sampling.max_staleness": k,
                                                               "parallel.num_devices": 1}))
    runs[k] = read_records(tmp_path / f"k{k}" / "grpo")
  assert runs[0][0]["update/loss"] == runs[1][0]["update/loss"]
  assert runs[0][1]["update/loss"] != runs[1][1]["update/loss"]
  for k, records in runs.items():   # the trainer's wall per iteration, update included
    assert all(r["time/iteration_s"] >= r["time/update_s"] > 0 for r in records), k


@pytest.mark.parametrize("k", [0, 1])
def test_sampler_on_its_own_devices_equals_colocated(k, tmp_path):
  """8 simulated devices, 4 train and 4 sample (weights resharded to them after every
  update), equal 4 colocated devices exactly."""
  assert jax.device_count() == 8
  runs = {}
  for name, extra in (("colocated", {"parallel.num_devices": 4}),
                      ("split", {"parallel.sampler_devices": 4})):
    train(micro_config("grpo", tmp_path / name, **SIGNAL, **extra,
                       **{"sampling.max_staleness": k}))
    runs[name] = read_records(tmp_path / name / "grpo")
  split = runs["split"]
  assert all(r["sync/bytes"] > 0 and r["sync/seconds"] > 0 for r in split)
  assert _comparable(tmp_path / "colocated" / "grpo") == _comparable(tmp_path / "split" / "grpo")


def _failing_score(kind):
  def score(self, prompt, completion):
    if hash(completion) % 3 == 0:
      raise RuntimeError("broken verifier")
    return tasks.RewardBreakdown(total=0.0, accuracy=0.0, format=0.0)
  return score


def test_failures_in_the_sampler_thread_are_contained_or_raised(tmp_path, monkeypatch):
  monkeypatch.setattr(tasks.Task, "score", _failing_score("raise"))
  config = micro_config("grpo", tmp_path / "contained", **{"sampling.max_staleness": 1,
                                                           "run.iterations": 2})
  train(config)
  records = read_records(tmp_path / "contained" / "grpo")
  assert sum(r["train/reward_failures"] for r in records) > 0
  config = micro_config("grpo", tmp_path / "raised", **{
      "sampling.max_staleness": 1, "run.iterations": 2, "task.reward_on_failure": "raise"})
  with pytest.raises(RewardError, match="broken verifier"):
    train(config)
