"""The effective per-token gradient weight of a policy-gradient loss variant.

Every policy-gradient loss built from `rljax.ops` has a gradient of the form

    ∇_θ L = −Σ_t w_t ∇_θ log π_θ(y_t),

so the per-token coefficient w_t says everything a loss does to the batch: w_t > 0 means
a gradient-descent step raises log π(y_t) (the token is promoted), w_t < 0 lowers it.
`effective_weights` obtains w_t exactly as −∂L/∂logπ_t with `jax.grad` of the aggregated
loss with respect to the per-token log-prob array; nothing is derived by hand, so any
combination of clip range, dual clip, ratio level, aggregation mode, entropy mask,
PSR/NSR weights and overlong filter is covered. A `LossVariant` names one such combination.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rljax.ops import aggregate as agg
from rljax.ops import masks
from rljax.ops.policy_loss import (
    POLICY_LOSSES,
    PolicyLossSpec,
    apply_policy_loss,
    policy_loss_fields,
    policy_loss_spec,
)


@dataclasses.dataclass(frozen=True)
class LossVariant:
  """The op arguments of one policy objective (hashable; field names follow `config.algo`).

  Attributes:
    name: label used in tables and plots.
    policy_loss: key of `rljax.ops.policy_loss.POLICY_LOSSES` ("ppo", "gspo", "cispo", ...).
    ratio_level: "token", "sequence" or "sequence_token" (policy_loss "ppo" only).
    eps_low, eps_high, dual_clip, ratio_cap: clip arguments (None: off).
    loss_agg: one of `rljax.ops.aggregate.AGGREGATION_MODES`.
    max_len: constant normaliser for "seq_mean_token_sum_norm".
    high_entropy_fraction: > 0 keeps only the top fraction of tokens by entropy.
    psr_weight, nsr_weight: weights of positive / negative-advantage samples.
    overlong_filter: drop truncated completions from the loss.
    extra: further config fields of the loss by their `algo` names, as ((name, value), ...)
      (e.g. (("dppo_delta_low", 0.05),)); unset ones take the config's defaults.
  """

  name: str = "baseline"
  policy_loss: str = "ppo"
  ratio_level: str = "token"
  eps_low: float = 0.2
  eps_high: float = 0.2
  dual_clip: float | None = None
  ratio_cap: float | None = None
  loss_agg: str = "seq_mean_token_mean"
  max_len: int | None = None
  high_entropy_fraction: float = 0.0
  psr_weight: float = 1.0
  nsr_weight: float = 1.0
  overlong_filter: bool = False
  extra: tuple[tuple[str, Any], ...] = ()

  def replace(self, **changes):
    return dataclasses.replace(self, **changes)


def as_variant(spec):
  """A LossVariant from a LossVariant or a dict of its fields (unknown keys raise)."""
  if isinstance(spec, LossVariant):
    return spec
  known = {f.name for f in dataclasses.fields(LossVariant)}
  unknown = sorted(set(spec) - known)
  if unknown:
    raise ValueError(f"unknown LossVariant fields {unknown}; valid: {sorted(known)}")
  return LossVariant(**spec)


def variant_from_config(config, *, name=None):
  """The LossVariant of an rljax config (reads `config.algo` and the sampler's max length):
  the same loss and arguments as the run's (`policy_spec` of the result equals the
  trainer's `LossSpec.policy`)."""
  a = config.algo
  own = POLICY_LOSSES[a.policy_loss].fields if a.policy_loss in POLICY_LOSSES else {}
  return LossVariant(
      name=name or f"{a.policy_loss}/{a.loss_agg}", policy_loss=a.policy_loss,
      ratio_level=a.ratio_level, eps_low=float(a.eps_low), eps_high=float(a.eps_high),
      dual_clip=float(a.dual_clip) or None, ratio_cap=float(a.ratio_cap) or None,
      loss_agg=a.loss_agg, max_len=int(config.sampling.max_new_tokens),
      high_entropy_fraction=float(a.high_entropy_fraction),
      psr_weight=float(a.psr_weight), nsr_weight=float(a.nsr_weight),
      overlong_filter=bool(a.overlong_filter),
      extra=tuple((field, _get(a, field, default)) for field, default in sorted(own.items())))


def _get(group, field, default):
  """`group.field` of a config (a ConfigDict, a dict or a namespace read from config.json)."""
  if isinstance(group, dict):
    return group.get(field, default)
  return getattr(group, field, default)


def policy_spec(v: LossVariant) -> PolicyLossSpec:
  """The variant's policy loss and its arguments, built by the trainer's own builder
  (`rljax.ops.policy_loss.policy_loss_spec`) from the variant's fields; `extra` holds
  further config fields of the loss by their `algo` names (e.g. ("dppo_delta_low", 0.05))."""
  fields = {**policy_loss_fields(), "ratio_level": v.ratio_level, "eps_low": v.eps_low,
            "eps_high": v.eps_high, "dual_clip": v.dual_clip or 0.0,
            "ratio_cap": v.ratio_cap or 0.0, "loss_agg": v.loss_agg, **dict(v.extra)}
  return policy_loss_spec(v.policy_loss, fields)


@functools.partial(jax.jit, static_argnums=0)
def _weights(v: LossVariant, logp_bt, old_logp_bt, advantages, mask, entropy_bt, truncated_b):
  spec = policy_spec(v)
  adv_bt = jnp.broadcast_to(advantages[:, None], mask.shape) if advantages.ndim == 1 else advantages
  token_w = jnp.ones(mask.shape, jnp.float32)
  if v.psr_weight != 1.0 or v.nsr_weight != 1.0:
    token_w = token_w * masks.psr_nsr_weights(
        adv_bt, positive_weight=v.psr_weight, negative_weight=v.nsr_weight)
  if v.high_entropy_fraction > 0:
    token_w = token_w * masks.high_entropy_mask(entropy_bt, mask,
                                                top_fraction=v.high_entropy_fraction)
  loss_mask = masks.overlong_filter_mask(mask, truncated_b) if v.overlong_filter else mask

  def objective(logp):
    loss_bt, _ = apply_policy_loss(spec, logp, old_logp_bt, advantages, loss_mask)
    return agg.aggregate(loss_bt * token_w, loss_mask, v.loss_agg, max_len=v.max_len)

  return -jax.grad(objective)(logp_bt)


def effective_weights(variant, logp_bt, old_logp_bt, advantages, mask, *, entropy_bt=None,
                      truncated_b=None):
  """Per-token effective gradient weight w_t = −∂L/∂logπ_t of a loss variant.

  ∇_θ L = −Σ_t w_t ∇_θ log π_θ(y_t) for the aggregated loss L of `variant` (policy loss op,
  token weights, aggregation), evaluated at the current log-probs `logp_bt`. A
  gradient-descent step moves log π(y_t) in the direction of w_t.

  Note: the sign is that of the descent direction (w_t = +A_t/N for plain token-mean
  REINFORCE), so "higher weight" means "pushed up more". KL, entropy-bonus, value and
  ptx terms are not part of the variant; their gradients do not act through the sampled
  tokens' log-probs alone.

  Args:
    variant: LossVariant or dict of its fields.
    logp_bt: current-policy log-probs of the sampled tokens, float [B, T].
    old_logp_bt: sampling (old) policy log-probs, float [B, T].
    advantages: [B] or [B, T].
    mask: completion mask, [B, T].
    entropy_bt: per-token entropy [B, T]; required when the variant uses the entropy mask.
    truncated_b: bool [B]; required when the variant uses the overlong filter.
  Returns:
    w, float32 NumPy [B, T], 0 at masked positions.
  """
  v = as_variant(variant)
  mask = jnp.asarray(mask, jnp.float32)
  if v.high_entropy_fraction > 0 and entropy_bt is None:
    raise ValueError(f"variant {v.name!r} uses the entropy mask: pass entropy_bt")
  if v.overlong_filter and truncated_b is None:
    raise ValueError(f"variant {v.name!r} uses the overlong filter: pass truncated_b")
  entropy = jnp.zeros(mask.shape) if entropy_bt is None else jnp.asarray(entropy_bt, jnp.float32)
  trunc = (jnp.zeros(mask.shape[:1], bool) if truncated_b is None
           else jnp.asarray(truncated_b, bool))
  w = _weights(v, jnp.asarray(logp_bt, jnp.float32), jnp.asarray(old_logp_bt, jnp.float32),
               jnp.asarray(advantages, jnp.float32), mask, entropy, trunc)
  return np.where(np.asarray(mask) > 0, np.asarray(w), 0.0).astype(np.float32)
