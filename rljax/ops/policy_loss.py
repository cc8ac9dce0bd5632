"""Policy-gradient losses: PPO clip family (token / GSPO sequence / GSPO-token ratios,
clip-higher, dual clip, ratio cap) and Clip-Cov; the registry of every loss by name
(`POLICY_LOSSES`: CISPO and REINFORCE from `rljax.ops.policy_loss_weighted`, KL-Cov from
`rljax.ops.policy_loss_cov`, the 2025-26 losses from `rljax.ops.policy_loss_gated`; every
kernel stays importable from here).

Every loss has the signature `fn(logp, old_logp, advantages, mask, **hyper)` and returns
`(loss_bt, PolicyLossDiagnostics)`: a per-token loss to *minimise* (the negated surrogate
objective), 0 at masked positions, to be reduced with `rljax.ops.aggregate`. Advantages
may be per sequence `[B]` (broadcast over tokens) or per token `[B, T]`.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import NamedTuple

import jax
import jax.numpy as jnp

from rljax.ops import policy_loss_gated as gated
from rljax.ops.policy_loss_common import PolicyLoss, PolicyLossDiagnostics  # noqa: F401
from rljax.ops.policy_loss_common import advantages_bt as _advantages_bt
from rljax.ops.policy_loss_common import diagnostics as _diagnostics
from rljax.ops.policy_loss_cov import clip_cov_mask, kl_cov_loss
from rljax.ops.policy_loss_weighted import CISPO_CONVENTIONS, cispo_loss, reinforce_loss
from rljax.ops.ratios import gspo_token_log_ratio, sequence_log_ratio, token_log_ratio

RATIO_LEVELS = ("token", "sequence", "sequence_token")


def _check_hyper(eps_low, eps_high, dual_clip, ratio_cap):
  for name, v in (("eps_low", eps_low), ("eps_high", eps_high)):
    if isinstance(v, int | float) and v < 0:
      raise ValueError(f"{name} must be >= 0, got {v}")
  if isinstance(dual_clip, int | float) and dual_clip <= 1.0:
    raise ValueError(f"dual_clip c must be > 1 (Ye et al. 2020), got {dual_clip}")
  if isinstance(ratio_cap, int | float) and ratio_cap <= 1.0:
    raise ValueError(f"ratio_cap delta must be > 1, got {ratio_cap}")


def policy_loss(logp, old_logp, advantages, mask, *, ratio_level="token", eps_low=0.2,
                eps_high=0.2, dual_clip=None, ratio_cap=None):
  """PPO clipped surrogate with decoupled clip, dual clip, ratio cap; token or GSPO ratio.

  Per token, with ratio ρ and advantage A:
    L = −min(min(ρ, δ)·A, clip(ρ, 1 − ε_low, 1 + ε_high)·A)    (δ = ∞ unless `ratio_cap`)
    L ← min(L, c·|A|)  where A < 0                              if `dual_clip` c is set
  i.e. −min(ρA, clip(ρ)A) of PPO (Schulman et al. 2017, arXiv:1707.06347, Eq. 7) with
  DAPO's decoupled ε_low/ε_high "clip-higher" (Yu et al. 2025, "DAPO: An Open-Source LLM
  Reinforcement Learning System at Scale", arXiv:2503.14476, Eq. 10), dual-clip PPO
  (Ye et al. 2020, "Mastering Complex Control in MOBA Games with Deep Reinforcement
  Learning", arXiv:1912.09729, §3.3) in verl's form (`compute_policy_loss_vanilla` and `clip_ratio_c` in
  volcengine/verl `verl/trainer/ppo/core_algos.py`), and the two-sided GRPO clip of INTELLECT-2 (Prime Intellect Team 2025,
  "INTELLECT-2: A Reasoning Model Trained Through Globally Decentralized Reinforcement
  Learning", arXiv:2505.07291, §4.1, δ = 4 there) in TRL's form (`GRPOTrainer`, argument
  `delta`): δ caps only the *unclipped* branch; the clipped branch still sees the raw ρ.

  Per sign of A this is (lo = 1 − ε_low, hi = 1 + ε_high; δ = ∞, c = ∞ when unset):
    A > 0:  L = −A·min(ρ, δ, hi)                      (δ < hi replaces hi as the ceiling)
    A < 0:  L = |A|·clip(ρ, lo, min(c, max(δ, hi)))
  so for A < 0 the cap bounds the loss at δ·|A| when δ ≥ hi (INTELLECT-2's purpose: a
  token with a huge ratio and a negative advantage cannot blow up the update), and at
  hi·|A| when δ < hi. Any δ > 1 is valid. For δ ≥ hi this equals capping ρ before the
  clip (ρ ← min(ρ, δ), then PPO); for 1 < δ < hi the two orders differ on A < 0 tokens
  with ρ > δ (capping first would bound them at δ·|A|; TRL's order lets ρ ∈ (δ, hi] keep
  its gradient and bounds the loss at hi·|A|).

  `ratio_level` picks ρ:
    "token":          ρ_{i,t} = exp(log r_{i,t}) (PPO, GRPO, DAPO); see `token_log_ratio`.
    "sequence":       ρ_{i,t} = s_i for every token t of sequence i (GSPO: Zheng et al. 2025,
                      "Group Sequence Policy Optimization", arXiv:2507.18071, Eqs. 5 and 7).
                      One clip decision per sequence (per sign of A); the gradient flows into
                      every token through s_i, ∂s_i/∂logπ_{i,t} = s_i/|y_i|. Each token row
                      carries the *sequence* surrogate, so `seq_mean_token_mean` gives exactly
                      the paper's (1/G)Σ_i min(s_i A_i, clip(s_i)A_i); `token_mean` weights
                      each sequence's surrogate by |y_i|.
    "sequence_token": ρ_{i,t} = exp(log s_i) in value with gradient s_i·∇logπ_{i,t}
                      (GSPO-token, arXiv:2507.18071 §4.3); equals "sequence" in value, and
                      in gradient under `seq_mean_token_mean` when A is constant per sequence.

  Note: log-ratios are clamped to ±20 before exp (see `rljax.ops.ratios`). The ratio cap
  and the dual clip act on the ratio the level defines: at sequence level on s_i, as TRL
  does with `importance_sampling_level="sequence"` (it caps its sequence ratio the same
  way); TRL has neither a GSPO-token level nor a dual clip, so for those rljax applies the
  formulas above unchanged (for "sequence_token" a capped s_i stops the gradient of every
  token of the sequence). The dual clip comes last, on the capped loss, as verl bounds
  its final PPO loss. Diagnostics name the bound that is active (the loss is flat in ρ
  because of it): `clip_high_bt` A > 0 and ρ > hi with hi ≤ δ; `clip_low_bt` A < 0 and
  ρ < lo; `ratio_cap_bt` the cap changed the loss, i.e. A > 0 and ρ > δ with δ < hi, or
  A < 0 and ρ > max(δ, hi), and the dual clip does not bound it; `clip_dual_bt` the dual
  clip bounds it. `ratio_bt` is the raw ρ (s_i at sequence level), before any cap.

  Args:
    logp: current-policy log-probs of the sampled tokens, [B, T].
    old_logp: old-policy log-probs, [B, T].
    advantages: [B] (broadcast over tokens) or [B, T].
    mask: completion mask, [B, T].
    ratio_level: "token", "sequence" or "sequence_token".
    eps_low: lower clip range ε_low (ratio floor 1 − ε_low).
    eps_high: upper clip range ε_high (ratio ceiling 1 + ε_high; DAPO uses 0.28).
    dual_clip: c > 1 bounding the loss of A < 0 tokens at c·|A| (verl: 3.0), or None.
    ratio_cap: δ > 1 capping the unclipped branch, min(ρ, δ)·A (TRL `delta`, INTELLECT-2;
      TRL recommends δ > 1 + ε), or None.
  Returns:
    (loss_bt float32 [B, T] with 0 at masked positions, PolicyLossDiagnostics).
  """
  if ratio_level not in RATIO_LEVELS:
    raise ValueError(f"Unknown ratio_level {ratio_level!r}; valid: {RATIO_LEVELS}")
  _check_hyper(eps_low, eps_high, dual_clip, ratio_cap)
  adv = _advantages_bt(advantages, mask)
  log_r_token = token_log_ratio(logp, old_logp, mask)
  if ratio_level == "token":
    log_r = log_r_token
  elif ratio_level == "sequence":
    log_r = jnp.broadcast_to(sequence_log_ratio(logp, old_logp, mask)[:, None], mask.shape)
  else:
    log_r = gspo_token_log_ratio(logp, old_logp, mask)
  ratio = jnp.exp(log_r)
  clipped_ratio = jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
  unclipped_ratio = ratio if ratio_cap is None else jnp.minimum(ratio, ratio_cap)
  loss = jnp.maximum(-adv * unclipped_ratio, -adv * clipped_ratio)
  dual = jnp.zeros(mask.shape, bool)
  if dual_clip is not None:
    bound = -adv * dual_clip
    dual = (adv < 0) & (loss > bound)
    loss = jnp.where(adv < 0, jnp.minimum(loss, bound), loss)
  high = (adv > 0) & (ratio > 1.0 + eps_high)
  capped = jnp.zeros(mask.shape, bool)
  if ratio_cap is not None:
    cap_below_high = jnp.asarray(ratio_cap < 1.0 + eps_high)
    capped = (((adv > 0) & (ratio > ratio_cap) & cap_below_high)
              | ((adv < 0) & (ratio > jnp.maximum(ratio_cap, 1.0 + eps_high)) & ~dual))
    high = high & ~cap_below_high
  diag = _diagnostics(
      mask, ratio, log_r_token,
      clip_low_bt=(adv < 0) & (ratio < 1.0 - eps_low),
      clip_high_bt=high, clip_dual_bt=dual, ratio_cap_bt=capped)
  return jnp.where(mask > 0, loss, 0.0), diag


def clip_cov_loss(logp, old_logp, advantages, mask, *, key, clip_fraction=2e-4,
                  cov_low=1.0, cov_high=5.0, eps_low=1.0, eps_high=1.0):
  """Clip-Cov loss: token-level PPO loss with the `clip_cov_mask` tokens zeroed (detached).

  Cui et al. 2025, arXiv:2505.22617, §4.2 (Clip-Cov). Returns (loss_bt, diagnostics) with
  `cov_selected_bt` marking the detached tokens.

  Note: the defaults ε_low = ε_high = 1 are the authors' recipe (verl
  recipe/entropy/7b_clip_cov.sh), which leaves the ratio almost unclipped, as in the
  paper's formulation; the selected tokens' loss is zeroed, removing their gradient.

  Args:
    logp, old_logp: current / old log-probs, [B, T].
    advantages: [B] or [B, T].
    mask: completion mask, [B, T].
    key, clip_fraction, cov_low, cov_high, eps_low, eps_high: as in `clip_cov_mask`.
  Returns:
    (loss_bt [B, T], PolicyLossDiagnostics).
  """
  keep_cov = clip_cov_mask(
      logp, old_logp, advantages, mask, key=key, clip_fraction=clip_fraction,
      cov_low=cov_low, cov_high=cov_high, eps_low=eps_low, eps_high=eps_high)
  loss, diag = policy_loss(logp, old_logp, advantages, mask, eps_low=eps_low,
                           eps_high=eps_high)
  selected = jnp.where(mask > 0, 1.0 - keep_cov, 0.0)
  return loss * keep_cov, diag._replace(cov_selected_bt=selected)


def _none_if_zero(x):
  return float(x) or None


def _ppo_kwargs(f):
  return dict(eps_low=float(f["eps_low"]), eps_high=float(f["eps_high"]),
              dual_clip=_none_if_zero(f["dual_clip"]), ratio_cap=_none_if_zero(f["ratio_cap"]))


def _cispo_kwargs(f):
  if f["cispo_convention"] == "absolute_cap":
    return dict(convention="absolute_cap", cap=float(f["cispo_cap"]))
  return dict(convention="two_sided", eps_low=float(f["eps_low"]), eps_high=float(f["eps_high"]))


def _cispo_check(f):
  if f["cispo_convention"] in CISPO_CONVENTIONS:
    return [] if f["cispo_cap"] > 0 else [f"algo.cispo_cap={f['cispo_cap']} must be > 0"]
  return [f"algo.cispo_convention={f['cispo_convention']!r} is not one of "
          f"{list(CISPO_CONVENTIONS)}"]


# Every policy loss by name (config: algo.policy_loss): the kernel, the config fields it owns
# and how the config's fields become its arguments (`policy_loss_spec`). "gspo" and
# "gspo_token" are "ppo" with algo.ratio_level set.
POLICY_LOSSES = {
    "ppo": PolicyLoss(policy_loss, kwargs=lambda f: dict(_ppo_kwargs(f),
                                                         ratio_level=f["ratio_level"])),
    "gspo": PolicyLoss(functools.partial(policy_loss, ratio_level="sequence"),
                       kwargs=_ppo_kwargs),
    "gspo_token": PolicyLoss(functools.partial(policy_loss, ratio_level="sequence_token"),
                             kwargs=_ppo_kwargs),
    "cispo": PolicyLoss(cispo_loss, kwargs=_cispo_kwargs,
                        fields={"cispo_convention": "two_sided", "cispo_cap": 5.0},
                        check=_cispo_check),
    "reinforce": PolicyLoss(reinforce_loss),
    "clip_cov": PolicyLoss(
        clip_cov_loss, needs_key=True,
        kwargs=lambda f: dict(clip_fraction=float(f["clip_cov_ratio"]),
                              cov_low=float(f["clip_cov_low"]), cov_high=float(f["clip_cov_high"]),
                              eps_low=float(f["eps_low"]), eps_high=float(f["eps_high"])),
        fields={"clip_cov_ratio": 2e-4, "clip_cov_low": 1.0, "clip_cov_high": 5.0}),
    "kl_cov": PolicyLoss(
        kl_cov_loss, kwargs=lambda f: dict(kl_fraction=float(f["kl_cov_ratio"]),
                                           kl_coef=float(f["kl_cov_coef"])),
        fields={"kl_cov_ratio": 2e-4, "kl_cov_coef": 1.0}),
    **gated.GATED_LOSSES,   # SAPO, GMPO, GPG, DPPO, DRO, LUSPO, VESPO
}


def get_policy_loss(name):
  """The kernel of the policy loss registered as `name` (error lists valid names)."""
  if name not in POLICY_LOSSES:
    raise ValueError(f"Unknown policy loss {name!r}; valid names: {sorted(POLICY_LOSSES)}")
  return POLICY_LOSSES[name].fn


class PolicyLossSpec(NamedTuple):
  """A policy loss with its arguments: hashable, a static argument of a jitted loss."""

  name: str
  kwargs: tuple = ()       # sorted (argument, value) pairs


def policy_loss_spec(name: str, fields: Mapping) -> PolicyLossSpec:
  """The one function that turns config fields into a loss's arguments: the trainer's
  objective and the trick-impact analysis both build their loss with it.

  Args:
    name: a key of POLICY_LOSSES.
    fields: the `algo` fields by name (`fields["eps_low"]`, ...): a config group or a dict.
  """
  get_policy_loss(name)
  return PolicyLossSpec(name, tuple(sorted(POLICY_LOSSES[name].kwargs(fields).items())))


def apply_policy_loss(spec: PolicyLossSpec, logp, old_logp, advantages, mask, *, key=None):
  """Runs the loss `spec` names: `(loss_bt [B, T], PolicyLossDiagnostics)`.

  Args:
    key: PRNG key for a loss that needs one (Clip-Cov); ignored otherwise.
  """
  entry = POLICY_LOSSES[spec.name]
  extra = {"key": key if key is not None else jax.random.key(0)} if entry.needs_key else {}
  return entry.fn(logp, old_logp, advantages, mask, **dict(spec.kwargs), **extra)


def policy_loss_fields() -> dict:
  """The config fields every registered loss owns, with their defaults (`algo.<field>`)."""
  out = {}
  for name, entry in POLICY_LOSSES.items():
    for field, default in entry.fields.items():
      if field in out and out[field] != default:
        raise ValueError(f"policy loss {name!r} declares algo.{field}={default!r}, another "
                         f"loss {out[field]!r}")
      out[field] = default
  return out
