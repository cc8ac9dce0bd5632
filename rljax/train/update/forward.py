"""Jitted forward passes over a whole rollout batch (old and reference log-probs, entropies,
values, Σπ² for the optimal token baseline), in micro-batches like the update step, and
where the old policy's log-probs come from (`algo.old_logp_source`): one strategy object,
chosen once when the trainer is built (`old_logp_source`).

- `Recompute`: a forward pass of the policy before the update (the default).
- `Sampler`: the sampler's own log-probs (no train-inference correction: the ratio is taken
  against the sampling distribution itself); the forward still gives the entropies.
- `FromUpdate`: no forward pass; the update step's own forward gives them (one update per
  rollout, so π_old = sg(π_θ) exactly) and returns them per token, and the rollout
  statistics that need them are taken after the update.

Each also picks the train-inference correction weights (`correction`, TIS / IcePop of
`rljax.ops.mismatch`) the run's `algo.is_correction` and `algo.off_policy_correction` name.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import ClassVar

import jax
import jax.numpy as jnp
from flax import nnx

from rljax import parallel
from rljax.ops import mismatch
from rljax.parallel import batch_sharding
from rljax.train.config.specs import LossSpec, PolicySourcesSpec, Specs
from rljax.train.params import policy_params
from rljax.train.update import objective, packing, routing
from rljax.train.update.batch import UpdateBatch, old_policy_metrics

SEQUENCE_KEYS = ("prompt_tokens", "prompt_mask", "tokens", "mask")


def split_micro(tree, num_micro):
  """[B, ...] leaves -> [num_micro, B/num_micro, ...]; scalars are broadcast."""
  def split(x):
    if jnp.ndim(x) == 0:
      return jnp.broadcast_to(x, (num_micro,))
    return x.reshape((num_micro, x.shape[0] // num_micro) + x.shape[1:])
  return jax.tree.map(split, tree)


def in_micro_batches(fn, num_micro: int):
  """fn(params, batch) run over `num_micro` consecutive row chunks in a `lax.map` (one
  chunk's activations live at a time), outputs concatenated back in row order."""
  if num_micro == 1:
    return fn

  def chunked(params, batch):
    rows = jax.tree.leaves(batch)[0].shape[0]
    if rows % num_micro:
      raise ValueError(f"algo.microbatches={num_micro} must divide the {rows} rollout rows")
    out = jax.lax.map(lambda chunk: fn(params, chunk), split_micro(batch, num_micro))
    return jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), out)
  return chunked


def pack_batch(mesh, groups: int, lengths, completion_width, prompt_width, index=None):
  """The packing layout (`rljax.train.update.packing`) of the rows `index` of a batch,
  placed like its rows: `groups` = one group per (micro-batch, data shard).

  Args:
    lengths: host dict with `prompt_lengths` and `lengths` [B] (completion extents).
  """
  take = (lambda x: x) if index is None else (lambda x: x[index])  # noqa: E731
  layout = packing.pack_layout(take(lengths["prompt_lengths"]), take(lengths["lengths"]),
                               prompt_width=prompt_width, completion_width=completion_width,
                               groups=groups)
  sharding = batch_sharding(mesh)
  return {k: jax.device_put(v, sharding) for k, v in packing.layout_arrays(layout).items()}


class ForwardFns:
  """Jitted forward passes over a whole rollout batch (compiled once per run), in
  `algo.microbatches` chunks like the update step, so they do not set the memory peak."""

  def __init__(self, loss: LossSpec, actor_graphdef, critic_graphdef, *, num_micro, mesh):
    temperature, pack_groups = loss.temperature, loss.pack_groups

    def policy_forward(params, batch):   # with routing replay: the sampler's experts
      return objective.policy_forward(nnx.merge(actor_graphdef, params), batch,
                                      temperature=temperature, pack_groups=pack_groups,
                                      replay=loss.routing_replay)

    def value_forward(params, batch):
      return objective.value_forward(nnx.merge(critic_graphdef, params), batch)

    def sum_sq_forward(params, batch):
      return objective.policy_sum_sq_forward(nnx.merge(actor_graphdef, params), batch,
                                             temperature=temperature)

    def jit(fn):   # traced under the mesh: model.attention="auto" picks splash on a TPU slice
      return jax.jit(parallel.traced_on(mesh, in_micro_batches(fn, num_micro)))

    self.policy_stats = jit(policy_forward)
    self.values = jit(value_forward)
    # (log-probs, Σπ²) for the optimal token baseline; compiled only when that mode calls it
    self.policy_sum_sq = jit(sum_sq_forward)

    def routed(params, batch):
      return routed_forward(nnx.merge(actor_graphdef, params), batch, temperature=temperature)

    # a MoE policy's rollout: log-probs with and without replay, the routing statistics
    self.policy_routed = jit(routed)
    self.pack_groups = num_micro * pack_groups   # packing layout groups per batch (0: padded)
    self.mesh = mesh

  def pack(self, lengths, completion_width, prompt_width, index=None):
    """The packing layout of (rows `index` of) a batch; {} when the run does not pack."""
    if not self.pack_groups:
      return {}
    return pack_batch(self.mesh, self.pack_groups, lengths, completion_width, prompt_width,
                      index)

  def sequences(self, upd):
    """The forwards' input: the sequence arrays of the `UpdateBatch` `upd`
    (`SEQUENCE_KEYS`; a MoE policy's `routes`), plus the packing layout of its rows when the
    run packs."""
    out = upd.sequences()
    if upd.routes is not None:
      out["routes"] = upd.routes
    out.update(self.pack(upd.extents(), out["tokens"].shape[1], out["prompt_tokens"].shape[1]))
    return out

  def compile_count(self):
    return (self.policy_stats._cache_size() + self.values._cache_size()
            + self.policy_sum_sq._cache_size() + self.policy_routed._cache_size())


def routed_forward(model, batch, *, temperature):
  """A MoE policy on a rollout with the sampler's `routes`: both forwards, own routing and
  replayed (`rljax.train.update.routing`).

  Returns:
    {"own": (logp, entropy) [B, T] with the trainer's own routing, "replay": the same with
     the sampler's experts, "stats": `routing.routing_row_stats` of the own forward}.
  """
  tokens, positions, attention = objective.full_sequence(batch)
  prompt_len = batch["prompt_tokens"].shape[1]
  logp, entropy, own = routing.routed_logprobs(model, tokens, positions, attention,
                                               prompt_len=prompt_len, temperature=temperature)
  replayed = routing.routed_logprobs(model, tokens, positions, attention, prompt_len=prompt_len,
                                     temperature=temperature,
                                     replay_ids=routing.replay_ids(batch, True))
  stats = routing.routing_row_stats(own, batch["routes"], routing.token_mask(batch),
                                    model.cfg.num_experts)
  return {"own": (logp, entropy), "replay": replayed[:2], "stats": stats}


def no_correction(old_logp, sampler_logp, mask):
  """Weights of 1 on every token."""
  return jnp.ones_like(old_logp)


def correction(sources: PolicySourcesSpec):
  """`weights(old_logp, sampler_logp, mask) -> [B, T]`: the train-inference correction (TIS or
  IcePop); stale samples' truncated IS weights (`algo.off_policy_correction='tis'`) are the
  same TIS weights."""
  kind = "tis" if sources.off_policy_correction == "tis" else sources.is_correction
  return {
      "none": no_correction,
      "tis": functools.partial(mismatch.truncated_is_weights, cap=sources.tis_cap,
                               level=sources.is_level),
      "icepop": functools.partial(mismatch.icepop_weights, low=sources.icepop_low,
                                  high=sources.icepop_high, level=sources.is_level),
  }[kind]


def policy_forward(fns, state, sequences, upd: UpdateBatch, *, replay: bool):
  """(log-probs, entropies) [B, T] of the policy of `state` on the batch's tokens, and a MoE
  rollout's routing metrics (`routing.routing_metrics`; {} for a dense policy): with the
  sampler's experts when `replay`, else the policy's own routing."""
  params = policy_params(state)
  if upd.routes is None:
    return (*fns.policy_stats(params, sequences), {})
  out = fns.policy_routed(params, sequences)
  view = out["replay"] if replay else out["own"]
  metrics = routing.routing_metrics(out["stats"], out["replay"][0], out["own"][0],
                                    upd.sampler_logp, upd.float_mask())
  return (*view, metrics)


@dataclasses.dataclass(frozen=True)
class Recompute:
  """Old log-probs from a forward pass of the policy before the update."""

  replay: bool = False      # MoE: with the sampler's experts (`algo.routing_replay`)
  logp_gap: ClassVar[bool] = True   # the sampler-trainer log-prob gap is a rollout metric

  def outputs(self, fns, state, sequences, upd: UpdateBatch):
    """(old log-probs, entropies) [B, T] and the routing metrics of a MoE rollout."""
    return policy_forward(fns, state, sequences, upd, replay=self.replay)

  def correction(self, sources: PolicySourcesSpec):
    """The correction weights of the run's `algo.is_correction` (`correction`)."""
    return correction(sources)

  def rollout_metrics(self, upd: UpdateBatch, *, with_ref: bool) -> dict:
    """The old policy's metrics, taken before the update."""
    return old_policy_metrics(upd, with_ref=with_ref)

  def after_update(self, upd: UpdateBatch, token_outputs, *, with_ref: bool):
    """(the batch, metrics) after the update: unchanged, nothing."""
    return upd, {}


@dataclasses.dataclass(frozen=True)
class Sampler(Recompute):
  """Old log-probs from the sampler; the entropies from the policy's forward."""

  logp_gap: ClassVar[bool] = False

  def outputs(self, fns, state, sequences, upd: UpdateBatch):
    """The sampler's log-probs, the policy's entropies and routing metrics."""
    _, entropy, routed = super().outputs(fns, state, sequences, upd)
    return upd.sampler_logp, entropy, routed

  def correction(self, sources: PolicySourcesSpec):
    """None: the ratio is taken against the sampling distribution itself."""
    return no_correction


@dataclasses.dataclass(frozen=True)
class FromUpdate(Recompute):
  """Old log-probs from the update step's own forward pass (`LossSpec.old_logp_from_update`):
  zeros until the update returns them."""

  def outputs(self, fns, state, sequences, upd: UpdateBatch):
    """Zeros (no forward pass), no routing metrics."""
    zeros = jnp.zeros_like(upd.sampler_logp)
    return zeros, zeros, {}

  def rollout_metrics(self, upd: UpdateBatch, *, with_ref: bool) -> dict:
    """None before the update (`after_update` takes them)."""
    return {}

  def after_update(self, upd: UpdateBatch, token_outputs, *, with_ref: bool):
    """A new batch with the update's old log-probs and entropies (rows in batch order),
    and the old policy's metrics."""
    upd = upd._replace(old_logp=token_outputs["old_logp"], entropy=token_outputs["entropy"])
    return upd, old_policy_metrics(upd, with_ref=with_ref)


OLD_LOGP_SOURCES = {"recompute": Recompute, "sampler": Sampler, "update": FromUpdate}


def old_logp_source(specs: Specs) -> Recompute:
  """The run's strategy (`algo.old_logp_source`, `algo.routing_replay`)."""
  name = specs.sources.old_logp_source
  if name not in OLD_LOGP_SOURCES:
    raise ValueError(f"algo.old_logp_source={name!r} is not one of {list(OLD_LOGP_SOURCES)}")
  return OLD_LOGP_SOURCES[name](replay=specs.loss.routing_replay)
