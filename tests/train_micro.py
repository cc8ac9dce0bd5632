"""A micro configuration of the trainer for end-to-end tests (seconds per iteration on CPU)."""

import json

from rljax.train.config import load_config

MICRO = {
    "run.iterations": 2, "run.save_every": 0, "run.eval_every": 0, "run.progress": False,
    "run.plots": False, "run.tensorboard": False,
    "model.hidden_size": 32, "model.intermediate_size": 64, "model.num_layers": 1,
    "model.num_heads": 2, "model.num_kv_heads": 1, "model.head_dim": 16,
    "sft.steps": 0, "sampling.prompts_per_iteration": 4, "sampling.n": 4,
    "sampling.max_new_tokens": 24, "sampling.eval_n": 2, "task.heldout_size": 8,
    "algo.overlong_cache_len": 4,
    # 16 rows in 2 minibatches of 8 (one row per simulated device), 2 epochs: 4 updates per
    # rollout as in the base regime
    "algo.minibatches": 2,
}


def micro_config(spec, tmp_path, **extra):
  """Loads `experiments/NAME.py[:arg]` with the MICRO overrides; run.dir = tmp_path/NAME[_arg]."""
  overrides = dict(MICRO, **{"run.dir": str(tmp_path / spec.replace(":", "_"))})
  overrides.update(extra)
  name, _, arg = spec.partition(":")
  return load_config(f"experiments/{name}.py" + (f":{arg}" if arg else ""), overrides)


def read_records(run_dir):
  return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def built(config):
  """(run, fresh placed state, trainer) of a config: `rljax.train.run.build` and the
  compiled iteration pieces, without SFT or a rollout."""
  from rljax.train.run.build import build
  from rljax.train.run.iteration import make_trainer

  run = build(config)
  state = run.params.init_state(run.params.initial_actor)
  return run, state, make_trainer(run, state)


def restored_state(run_dir, config):
  """The latest checkpoint of `run_dir` restored into the structure of `config`'s state."""
  from rljax.train.params import Checkpointer
  from rljax.train.run.build import build

  run = build(config)
  ckpt = Checkpointer(run_dir, keep=1)
  try:
    return run.params.restore(ckpt, run.params.init_state(run.params.initial_actor))[1]
  finally:
    ckpt.close()


def spy_versions(monkeypatch):
  """Records, for every update, (iteration, the versions that sampled its batch, its
  completion mask): [B] versions per row, or [B, T] per token with partial rollouts."""
  import numpy as np

  from rljax.train.update.prepare import Preparer

  seen, prepare = [], Preparer.prepare

  def spy(preparer, state, batch, *args, iteration=0, **kwargs):
    seen.append((iteration, np.asarray(batch.versions).copy(), np.asarray(batch.mask)))
    return prepare(preparer, state, batch, *args, iteration=iteration, **kwargs)
  monkeypatch.setattr(Preparer, "prepare", spy)
  return seen
