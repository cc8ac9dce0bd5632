"""The start's evaluation cache is shared by parallel runs (an ablation's steps and seeds):
concurrent writers must not collide (the CI run of 2026-11-26 hit FileNotFoundError when
two test workers renamed the same temporary file)."""

import json
import threading

import numpy as np

from rljax.train.run.heldout import write_start_cache


def test_concurrent_writers_of_the_start_cache_do_not_collide(tmp_path):
  path = tmp_path / "sft_cache" / "heldout_abc.npz"
  per_prompt = {"greedy_correct": np.arange(500) % 2}
  errors = []

  def write():
    try:
      write_start_cache(path, {"heldout_acc": 0.5}, per_prompt)
    except Exception as e:  # noqa: BLE001 - collected and reported below
      errors.append(e)

  threads = [threading.Thread(target=write) for _ in range(16)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert not errors, errors
  with np.load(path) as data:
    assert json.loads(str(data["summary"])) == {"heldout_acc": 0.5}
    np.testing.assert_array_equal(data["greedy_correct"], per_prompt["greedy_correct"])
  assert sorted(p.name for p in path.parent.iterdir()) == [path.name]   # no temporaries left
