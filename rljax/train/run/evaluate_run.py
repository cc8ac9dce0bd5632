"""`rljax eval --run DIR`: the latest checkpoint of a run, evaluated on its held-out prompts."""

from __future__ import annotations

import pathlib

import jax

from rljax.train.config import saved_config
from rljax.train.params.checkpoint import Checkpointer
from rljax.train.rollout import evaluate
from rljax.train.rollout.eval_sets import evaluate_sets
from rljax.train.run.build import build

__all__ = ["evaluate_run", "saved_config"]


def evaluate_run(run_dir, *, config=None) -> dict:
  """Held-out accuracy, avg@k and pass@k of the latest readable checkpoint of `run_dir`
  (and of its named evaluation sets, as `<name>/<metric>`)."""
  run_dir = pathlib.Path(run_dir)
  config = config or saved_config(run_dir)
  run = build(config)
  params = run.params
  ckpt = Checkpointer(run_dir, keep=run.specs.run.keep_checkpoints)
  try:
    restored = params.restore(ckpt, params.init_state(params.initial_actor))
  finally:
    ckpt.close()
  if restored is None:
    raise FileNotFoundError(f"no readable checkpoint in {run_dir}/checkpoints")
  s, model = run.specs.rollout, params.model(restored[1])
  out = evaluate(run.rollouts, model, run.heldout_prompts(), jax.random.key(0), n=s.eval_n,
                 temperature=s.eval_temperature)
  out.update(evaluate_sets(run.eval_sets, model, jax.random.key(0)))   # eval.sets
  return out
