"""Where the old policy's log-probs come from (`algo.old_logp_source`): one strategy object,
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

import jax.numpy as jnp

from rljax.ops import mismatch
from rljax.train.config.specs import PolicySourcesSpec, Specs
from rljax.train.params import policy_params
from rljax.train.update import routing
from rljax.train.update.batch import UpdateBatch, old_policy_metrics


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
