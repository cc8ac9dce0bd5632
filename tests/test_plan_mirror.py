"""`rljax plan` compiles the trainer's programs on abstract inputs: those inputs must be
the ones the trainer builds. On 8 CPU devices (no libtpu), the plan's TrainState and
update minibatch against the real ones of a micro run: same tree, shapes, dtypes and
shardings."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding

from rljax.ops.shaping import RunningMoments
from rljax.plan.abstract import abstract_run
from rljax.plan.programs import minibatch
from rljax.train.rollout.train_batches import iteration_keys, sample_now
from tests.train_micro import built, micro_config


def _described(tree):
  def one(x):
    spec = tuple(x.sharding.spec) if isinstance(x.sharding, NamedSharding) else None
    while spec and spec[-1] is None:   # P(a) == P(a, None)
      spec = spec[:-1]
    return (tuple(x.shape), jnp.dtype(x.dtype).name, spec)
  return jax.tree.map(one, tree)


@pytest.mark.parametrize("extra", [
    {"parallel.data": 2, "parallel.fsdp": 4},
    {"parallel.data": 1, "parallel.fsdp": 4, "parallel.tensor": 2, "algo.pack_sequences": True,
     "algo.kl_placement": "loss", "algo.kl_coef": 0.01},
])
def test_plan_state_and_minibatch_are_the_trainers(tmp_path, extra):
  config = micro_config("grpo", tmp_path, **extra)
  run, state, trainer = built(config)
  plan = abstract_run(config, jax.devices())
  assert jax.tree.structure(plan.state) == jax.tree.structure(state)
  assert _described(plan.state) == _described(state)

  sampled = sample_now(run.batches, state.rng, 0, run.params.model(state))
  key = iteration_keys(state.rng, 0)["update"]
  upd, _, _ = trainer.preparer.prepare(state, sampled.batch, key, RunningMoments.create())
  rows = plan.shapes.minibatch
  real = trainer.epochs.minibatch(state, upd, np.arange(rows), iteration=0, epoch=0, m=0)
  fake = minibatch(plan)
  # the plan's packing layout is its worst case (no two sequences share a row): same
  # entries, at most as many packed rows
  for key in ("pack_src", "pack_segment"):
    if key in real:
      assert real[key].shape[0] <= fake[key].shape[0] and real[key].shape[1:] == fake[key].shape[1:]
      real[key], fake[key] = real[key][:0], jax.ShapeDtypeStruct((0,) + fake[key].shape[1:],
                                                                 fake[key].dtype)
  assert sorted(real) == sorted(fake)
  for key in real:
    want = _described(real[key])
    got = _described(fake[key])
    assert got == want or (key.startswith("pack_") and got[:2] == want[:2]), key
