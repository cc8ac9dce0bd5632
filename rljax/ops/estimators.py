"""Advantage estimators by name (config: `algo.advantage`): the registry the trainer, the
config's validation and its defaults read.

A "sequence" estimator maps group scores `[P, G]` to advantages `[P, G]` (broadcast over
each completion's tokens by the trainer); a "token" estimator needs per-token rewards,
values or returns, which the trainer assembles for it (`rljax.train.update.advantages`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from rljax.ops import advantages as adv
from rljax.ops import advantages_group as group


class GroupInputs(NamedTuple):
  """What a sequence-level estimator may read besides the scores (all `[P, G]`)."""

  mask_bg: jax.Array       # 1 for samples that count in their group
  lengths_bg: jax.Array    # completion lengths
  greedy_bg: jax.Array | None = None   # the greedy completion's score (ReMax)


class AdvantageEstimator(NamedTuple):
  """An advantage estimator registered by name.

  Attributes:
    fn: sequence level: `fn(scores_pg, inputs: GroupInputs, **kwargs) -> [P, G]`; token
      level: the kernel the trainer calls with per-token inputs.
    level: "sequence" or "token".
    kwargs: `kwargs(fields) -> dict` from the `algo` fields by name.
    fields: the config fields this estimator owns, with their defaults.
    group: compares the samples of one prompt (needs sampling.n >= 2).
  """

  fn: Callable
  level: str = "sequence"
  kwargs: Callable[[Mapping], dict] = lambda fields: {}
  fields: Mapping[str, Any] = MappingProxyType({})
  group: bool = True


def _grpo(scale_by_std):
  return lambda s, x, *, eps: adv.group_advantages(s, scale_by_std=scale_by_std, eps=eps,
                                                   mask_bg=x.mask_bg)


def _remax(s, x):
  return adv.remax_advantages(s.reshape(-1), x.greedy_bg.reshape(-1)).reshape(s.shape) * x.mask_bg


def _eps(f):
  return {"eps": float(f["adv_eps"])}


ADVANTAGE_ESTIMATORS = {
    "grpo": AdvantageEstimator(_grpo(True), kwargs=_eps),
    "dr_grpo": AdvantageEstimator(_grpo(False), kwargs=_eps),
    "batch_std": AdvantageEstimator(
        lambda s, x, *, eps: adv.batch_std_advantages(s, eps=eps, mask_bg=x.mask_bg),
        kwargs=_eps, group=False),
    "rloo": AdvantageEstimator(lambda s, x: adv.rloo_advantages(s, mask_bg=x.mask_bg)),
    "pass_at_k": AdvantageEstimator(
        lambda s, x, *, k: adv.pass_at_k_advantages(s, k=k, mask_bg=x.mask_bg),
        kwargs=lambda f: {"k": int(f["pass_k"])}),
    "opo": AdvantageEstimator(
        lambda s, x: group.opo_advantages(s, x.lengths_bg, mask_bg=x.mask_bg)),
    "gpg": AdvantageEstimator(
        lambda s, x, *, f_norm, alpha: group.gpg_advantages(s, f_norm=f_norm, alpha=alpha,
                                                            mask_bg=x.mask_bg),
        kwargs=lambda f: {"f_norm": float(f["gpg_f_norm"]), "alpha": f["gpg_alpha"]},
        fields={"gpg_f_norm": 1.0, "gpg_alpha": "authors"}),
    "grpo_passk": AdvantageEstimator(
        lambda s, x, *, eps: group.grpo_passk_advantages(s, eps=eps, mask_bg=x.mask_bg),
        kwargs=_eps),
    "remax": AdvantageEstimator(_remax, group=False),
    "gae": AdvantageEstimator(adv.gae, level="token", group=False),
    "reinforce_pp": AdvantageEstimator(adv.reinforce_pp_advantages, level="token", group=False),
    "reinforce_pp_baseline": AdvantageEstimator(adv.reinforce_pp_baseline_advantages,
                                                level="token"),
    "optimal_token_baseline": AdvantageEstimator(
        group.optimal_token_baseline_advantages, level="token",
        kwargs=lambda f: {"handle_zero_tail": bool(f["otb_handle_zero_tail"])},
        fields={"otb_handle_zero_tail": True}),
}


def estimator_kwargs(name: str, fields: Mapping) -> tuple:
  """The estimator's keyword arguments from the `algo` fields, as sorted (name, value) pairs."""
  if name not in ADVANTAGE_ESTIMATORS:
    raise ValueError(f"unknown advantage estimator {name!r}; valid: {sorted(ADVANTAGE_ESTIMATORS)}")
  return tuple(sorted(ADVANTAGE_ESTIMATORS[name].kwargs(fields).items()))


def sequence_advantages(name: str, kwargs: tuple, scores_pg, inputs: GroupInputs):
  """Runs the sequence-level estimator `name` on `[P, G]` scores: `[P, G]` advantages."""
  return ADVANTAGE_ESTIMATORS[name].fn(jnp.asarray(scores_pg, jnp.float32), inputs,
                                       **dict(kwargs))


def estimator_fields() -> dict:
  """The config fields every registered estimator owns, with their defaults."""
  return {k: v for e in ADVANTAGE_ESTIMATORS.values() for k, v in e.fields.items()}
