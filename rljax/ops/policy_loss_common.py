"""Pieces every policy loss shares: the diagnostics tuple, advantage/mask handling, and the
registry entry (`PolicyLoss`) that names a loss, its config fields and its arguments.

Kept apart from `policy_loss` so the loss families in `policy_loss_gated` can use them
without an import cycle (`policy_loss` registers those families).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp


class PolicyLossDiagnostics(NamedTuple):
  """Per-token indicator/value arrays `[B, T]` (0 at masked positions; average them with
  `aggregate(x, mask, "token_mean")`) and a few scalars. No gradient flows through them.

  Attributes:
    clip_low_bt: A < 0 and the ratio is below the lower bound (lower clip active).
    clip_high_bt: A > 0 and the ratio is above the upper bound (upper clip active; with a
      ratio cap δ < 1 + ε_high the cap is the active bound instead). For CISPO: the IS
      weight was truncated from above (any sign of A).
    clip_dual_bt: A < 0 and the loss was bounded by the dual clip c·|A|.
    ratio_cap_bt: the ratio cap decided the token's loss. `policy_loss`: the cap δ of the
      unclipped branch changed the loss and made it flat in the ratio (A > 0 and ρ > δ
      with δ < 1 + ε_high; A < 0 and ρ > max(δ, 1 + ε_high), unless the dual clip binds).
      `dppo_loss`: the stop-gradient IS weight was truncated at C.
    cov_selected_bt: tokens picked by Clip-Cov (loss detached) or KL-Cov (KL added).
    ratio_bt: the ratio the loss used (the sequence ratio s_i broadcast for GSPO).
    approx_kl_bt: k3 estimate of KL(π_old‖π_θ) per token, (r − 1) − log r with the
      *token* ratio r (also for sequence-level losses); ≥ 0, unbiased.
    ratio_max: max of `ratio_bt` over unmasked tokens (0 if none).
    ratio_min: min of `ratio_bt` over unmasked tokens (0 if none).
  """

  clip_low_bt: jax.Array
  clip_high_bt: jax.Array
  clip_dual_bt: jax.Array
  ratio_cap_bt: jax.Array
  cov_selected_bt: jax.Array
  ratio_bt: jax.Array
  approx_kl_bt: jax.Array
  ratio_max: jax.Array
  ratio_min: jax.Array


def advantages_bt(advantages, mask):
  """Advantages as float32 [B, T] (broadcast from [B]), 0 at masked positions."""
  chex.assert_rank(mask, 2)
  chex.assert_rank(advantages, {1, 2})
  if advantages.ndim == 1:
    chex.assert_equal_shape_prefix((advantages, mask), 1)
    advantages = jnp.broadcast_to(advantages[:, None], mask.shape)
  chex.assert_equal_shape((advantages, mask))
  return jnp.where(mask > 0, advantages.astype(jnp.float32), 0.0)


def zero_masked(x, mask):
  """`x` where `mask` > 0, else 0 (a loss's masked positions), same shape."""
  return jnp.where(mask > 0, x, 0.0)


def diagnostics(mask, ratio, log_r_token, **indicators):
  """Builds PolicyLossDiagnostics; missing indicators are zeros; masks everything."""
  keep = mask > 0
  as_bt = lambda x: jax.lax.stop_gradient(jnp.where(keep, x.astype(jnp.float32), 0.0))
  zeros = jnp.zeros(mask.shape, jnp.float32)
  fields = {k: as_bt(indicators.get(k, zeros)) for k in (
      "clip_low_bt", "clip_high_bt", "clip_dual_bt", "ratio_cap_bt", "cov_selected_bt")}
  ratio = jax.lax.stop_gradient(ratio)
  any_token = jnp.any(keep)
  return PolicyLossDiagnostics(
      **fields,
      ratio_bt=as_bt(ratio),
      approx_kl_bt=as_bt(jnp.expm1(log_r_token) - log_r_token),
      ratio_max=jnp.where(any_token, jnp.max(jnp.where(keep, ratio, -jnp.inf)), 0.0),
      ratio_min=jnp.where(any_token, jnp.min(jnp.where(keep, ratio, jnp.inf)), 0.0),
  )


def _no_kwargs(fields: Mapping) -> dict:
  del fields
  return {}


def _no_errors(fields: Mapping) -> list:
  del fields
  return []


class PolicyLoss(NamedTuple):
  """A policy loss registered by name (`rljax.ops.policy_loss.POLICY_LOSSES`).

  Adding a loss is one entry beside its kernel: the trainer's config gains its `fields`
  (as `algo.<field>`, with these defaults), validation runs its `check`, and the trainer and
  the trick-impact analysis both turn config fields into kernel arguments with `kwargs`.

  Attributes:
    fn: the kernel, `fn(logp, old_logp, advantages, mask, **kwargs) -> (loss_bt, diag)`.
    kwargs: `kwargs(fields) -> dict` of the kernel's keyword arguments from the `algo`
      fields (a mapping by name: the loss's own fields and shared ones such as eps_low).
    fields: the config fields this loss owns, with their defaults.
    check: `check(fields) -> [message]`, each naming the invalid field.
    needs_key: the kernel takes a PRNG `key` (Clip-Cov's random choice of tokens).
  """

  fn: Callable
  kwargs: Callable[[Mapping], dict] = _no_kwargs
  fields: Mapping[str, Any] = MappingProxyType({})
  check: Callable[[Mapping], list] = _no_errors
  needs_key: bool = False

  def __call__(self, *args, **kwargs):
    return self.fn(*args, **kwargs)


def positive(fields: Mapping, *names: str) -> list:
  """Messages for the named fields that are not > 0."""
  return [f"algo.{n}={fields[n]} must be > 0" for n in names if not fields[n] > 0]


def non_negative(fields: Mapping, *names: str) -> list:
  """Messages for the named fields that are not >= 0."""
  return [f"algo.{n}={fields[n]} must be >= 0" for n in names if not fields[n] >= 0]


def clip_by_probability_bt(old_logp_bt, clip_low_bt, clip_high_bt, mask, *, prob_split=0.5):
  """Per-token clip indicators split by sampling probability, for use inside a jitted step.

  The jit-friendly counterpart of `clip_breakdown`: take `clip_low_bt` / `clip_high_bt`
  from `PolicyLossDiagnostics` and average each returned array with
  `aggregate(x, mask, "token_mean")` (or sum it with the other token metrics).

  Args:
    old_logp_bt: sampling-policy log-probs, [B, T].
    clip_low_bt, clip_high_bt: 0/1 indicators of the active lower / upper clip, [B, T].
    mask: [B, T].
    prob_split: probability threshold between "low" and "high" tokens.
  Returns:
    dict of float32 [B, T] arrays (0 at masked positions) named "clip_high_lowprob",
    "clip_high_highprob", "clip_low_lowprob", "clip_low_highprob".
  """
  chex.assert_equal_shape((old_logp_bt, clip_low_bt, clip_high_bt, mask))
  valid = mask > 0
  high_p = valid & (jnp.exp(jnp.where(valid, old_logp_bt, -jnp.inf)) >= prob_split)
  out = {}
  for side, clipped in (("high", clip_high_bt > 0), ("low", clip_low_bt > 0)):
    for name, group in (("lowprob", valid & ~high_p), ("highprob", high_p)):
      out[f"clip_{side}_{name}"] = (clipped & group).astype(jnp.float32)
  return out
