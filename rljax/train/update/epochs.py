"""Consuming one update batch: `epochs × minibatches` update steps over shuffled rows."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from rljax.train.config.specs import LossSpec, ScheduleSpec
from rljax.train.rollout.demonstrations import demonstration_batch
from rljax.train.update import objective
from rljax.train.update.batch import UpdateBatch
from rljax.train.update.forward import ForwardFns

UPDATE_KEYS = ("prompt_tokens", "prompt_mask", "tokens", "mask", "old_logp", "ref_logp",
               "advantages", "returns", "old_values", "token_weights", "is_weights", "rng")


def step_fields(loss: LossSpec) -> tuple:
  """The `UpdateBatch` fields the update step reads: `UPDATE_KEYS`, the sampler's log-probs
  (the behaviour policy of decoupled PPO) and its experts (routing replay)."""
  behaviour = ("sampler_logp",) if loss.decoupled_cap is not None else ()
  replay = ("routes",) if loss.routing_replay else ()
  return UPDATE_KEYS + behaviour + replay


@functools.partial(jax.jit, static_argnums=2)
def take_rows(tree, index, sharding):
  """Rows `index` of every array in `tree`, as one program (every process runs the same
  one, whatever the arrays' layout over processes), placed with `sharding`."""
  return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x[index], sharding), tree)


def ptx_batch(ctx, size: int, *, seed, completion_len: int):
  """Demonstrations mixed into the RL loss (InstructGPT's PPO-ptx, arXiv:2203.02155,
  Eq. 2), drawn reproducibly from `seed` = (run seed, iteration, epoch, minibatch)."""
  prompts = ctx.task.train_prompts()
  rng = np.random.default_rng([seed[0], 7, *seed[1:]])
  chosen = [prompts[i] for i in rng.integers(0, len(prompts), size)]
  return demonstration_batch(ctx, chosen, completion_len)


@dataclasses.dataclass
class Epochs:
  """The update steps of one iteration (`algo.epochs` × `algo.minibatches`)."""

  update_step: object
  fns: ForwardFns
  schedule: ScheduleSpec
  rows_sharding: object
  ptx_context: object = None   # the RolloutContext of ptx demonstrations (algo.ptx_coef)
  fields: tuple = UPDATE_KEYS   # what the update step reads (`step_fields`)
  seed: int = 0
  completion_len: int = 0

  def minibatch(self, state, upd: UpdateBatch, index, *, iteration, epoch, m):
    """The update step's input for rows `index` of `upd`."""
    rows = {k: getattr(upd, k) for k in self.fields}
    minibatch = take_rows(rows, jnp.asarray(index), self.rows_sharding)
    minibatch.update(self.fns.pack(upd.extents(), upd.tokens.shape[1],
                                   upd.prompt_tokens.shape[1], np.asarray(index)))
    minibatch["kl_coef"] = jnp.copy(state.kl_coef)   # own buffer: the state is donated
    if self.schedule.ptx_coef:
      minibatch["ptx"] = ptx_batch(self.ptx_context, len(index),
                                   seed=(self.seed, iteration, epoch, m),
                                   completion_len=self.completion_len)
    return minibatch

  def run(self, state, upd: UpdateBatch, update_key, *, train_actor: bool, iteration: int):
    """Returns (state, mean metrics over the steps as `update/<name>`, the per-token outputs
    of the last update step in `upd`'s row order). The step's per-token outputs are {}, or
    the old log-probs taken from its own forward pass (`old_logp.FromUpdate`: one
    minibatch); `upd` is not changed."""
    s = self.schedule
    b = upd.mask.shape[0]
    per_mb = b // s.minibatches
    steps, token_outputs = [], {}
    for epoch in range(s.epochs):
      perm = np.asarray(jax.random.permutation(jax.random.fold_in(update_key, epoch), b))
      for m in range(s.minibatches):
        index = perm[m * per_mb:(m + 1) * per_mb]
        minibatch = self.minibatch(state, upd, index, iteration=iteration, epoch=epoch, m=m)
        state, metrics = self.update_step(state, minibatch, jnp.asarray(train_actor))
        per_token = metrics.pop(objective.TOKEN_OUTPUTS)   # rows in `index` order
        token_outputs = {k: v[np.argsort(index)] for k, v in per_token.items()}
        steps.append({k: float(v) for k, v in metrics.items()})
    return state, {f"update/{k}": sum(m[k] for m in steps) / len(steps)
                   for k in steps[0]}, token_outputs
