"""From scores, KL and values to per-token advantages: the config decides which op runs.

Group estimators see the rollout as `[P, G]` (P prompts, G samples, prompt-major rows,
as `rljax.sampling.generate` returns them). Token estimators (GAE, REINFORCE++) see
per-token rewards `r_t = 1[t = last]·score − β·KL_t`. For sequence-level estimators the
KL penalty, when placed in the reward, is summed over the sequence and subtracted from
the score before the baseline (TRL's RLOO does the same).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from rljax.ops import advantages as adv_ops
from rljax.ops import advantages_group
from rljax.ops import kl as kl_ops


@dataclasses.dataclass(frozen=True)
class AdvantageSpec:
  mode: str
  group_size: int
  eps: float
  gamma: float
  lam: float
  pass_k: int
  whiten: bool
  kl_in_reward: bool
  kl_estimator: str
  gpg_f_norm: float = 1.0
  # GDPO (algo.reward_aggregation="normalize_then_sum"): weights of batch["reward_components"]
  # [B, K]; empty: the weighted sum batch["scores"] is the score (sum_then_normalize)
  reward_weights: tuple = ()


def gdpo_terms(reward_fn):
  """(names, weights) of the rewards GDPO normalises one by one: every weighted component
  of the run's reward (`rljax.rewards.base.Composite`), plus "shaping" (weight 1: what the
  length and repetition penalties add)."""
  terms = [(name, w) for name, _, w in reward_fn.terms if w != 0]
  return tuple(n for n, _ in terms) + ("shaping",), tuple(w for _, w in terms) + (1.0,)


def advantage_spec(config, reward_fn=None) -> AdvantageSpec:
  """The static advantage choices (`reward_fn` gives GDPO its reward weights)."""
  a = config.algo
  gdpo_weights = (gdpo_terms(reward_fn)[1]
                  if a.reward_aggregation == "normalize_then_sum" else ())
  return AdvantageSpec(mode=a.advantage, group_size=int(config.sampling.n), eps=float(a.adv_eps),
                       gamma=float(a.gamma), lam=float(a.lam), pass_k=int(a.pass_k),
                       whiten=bool(a.whiten_advantages),
                       kl_in_reward=a.kl_placement == "reward", kl_estimator=a.kl_estimator,
                       gpg_f_norm=float(a.gpg_f_norm), reward_weights=tuple(gdpo_weights))


def _group_estimate(spec: AdvantageSpec, scores_b, valid_b, greedy_scores_b, lengths_b):
  g = spec.group_size
  scores_pg = scores_b.reshape(-1, g)
  valid_pg = valid_b.reshape(-1, g)
  if spec.mode in ("grpo", "dr_grpo"):
    out = adv_ops.group_advantages(scores_pg, scale_by_std=spec.mode == "grpo", eps=spec.eps,
                                   mask_bg=valid_pg)
  elif spec.mode == "batch_std":
    out = adv_ops.batch_std_advantages(scores_pg, eps=spec.eps, mask_bg=valid_pg)
  elif spec.mode == "rloo":
    out = adv_ops.rloo_advantages(scores_pg, mask_bg=valid_pg)
  elif spec.mode == "pass_at_k":
    out = adv_ops.pass_at_k_advantages(scores_pg, k=spec.pass_k, mask_bg=valid_pg)
  elif spec.mode == "opo":
    out = advantages_group.opo_advantages(scores_pg, lengths_b.reshape(-1, g), mask_bg=valid_pg)
  elif spec.mode == "gpg":
    out = advantages_group.gpg_advantages(scores_pg, f_norm=spec.gpg_f_norm, mask_bg=valid_pg)
  elif spec.mode == "grpo_passk":
    out = advantages_group.grpo_passk_advantages(scores_pg, eps=spec.eps, mask_bg=valid_pg)
  elif spec.mode == "remax":
    return adv_ops.remax_advantages(scores_b, greedy_scores_b) * valid_b
  else:
    raise ValueError(f"not a sequence-level advantage mode: {spec.mode!r}")
  return out.reshape(-1)


@functools.partial(jax.jit, static_argnums=0)
def compute_advantages(spec: AdvantageSpec, batch, kl_coef):
  """Advantages [B,T] and returns [B,T] (returns only meaningful for GAE).

  Args:
    spec: static choices.
    batch: dict with scores [B], valid [B] (sequences that count), mask [B,T], old_logp,
      optionally ref_logp [B,T], values [B,T], greedy_scores [B].
    kl_coef: current β (scalar array).
  Returns:
    (advantages [B,T], returns [B,T], kl_bt [B,T] or zeros).
  """
  mask = batch["mask"] * batch["valid"][:, None]
  scores = batch["scores"].astype(jnp.float32)
  kl_bt = jnp.zeros(mask.shape, jnp.float32)
  if spec.kl_in_reward:
    kl_bt = kl_ops.kl_estimate(batch["old_logp"], batch["ref_logp"], spec.kl_estimator) * mask
  if spec.mode in ("gae", "reinforce_pp"):
    rewards_bt = kl_ops.kl_penalized_rewards(scores, kl_bt, mask, beta=kl_coef)
    if spec.mode == "gae":
      advantages, returns = adv_ops.gae(rewards_bt, batch["values"], mask, gamma=spec.gamma,
                                        lam=spec.lam)
    else:
      advantages = adv_ops.reinforce_pp_advantages(rewards_bt, mask, gamma=spec.gamma)
      returns = advantages
  elif spec.mode == "optimal_token_baseline":
    # G_t: reward-to-go of the outcome score (minus the KL penalties still ahead)
    rewards_bt = kl_ops.kl_penalized_rewards(scores, kl_bt, mask, beta=kl_coef)
    returns = jnp.flip(jnp.cumsum(jnp.flip(rewards_bt * mask, 1), axis=1), 1) * mask
    g = spec.group_size
    to_bgt = lambda x: x.reshape(-1, g, x.shape[-1])  # noqa: E731
    advantages = advantages_group.optimal_token_baseline_advantages(
        to_bgt(returns), to_bgt(batch["sampled_logp"]), to_bgt(batch["sum_sq"]),
        to_bgt(mask)).reshape(mask.shape)
  elif spec.mode == "reinforce_pp_baseline":
    seq_scores = scores - kl_coef * jnp.sum(kl_bt, axis=1)
    g = spec.group_size
    adv = adv_ops.reinforce_pp_baseline_advantages(
        seq_scores.reshape(-1, g), mask.reshape(-1, g, mask.shape[1]))
    advantages = adv.reshape(mask.shape)
    returns = advantages
  elif spec.reward_weights:   # GDPO; validate() allows it with "grpo" and no KL in reward
    g = spec.group_size
    comps = batch["reward_components"]
    adv_b = advantages_group.gdpo_advantages(
        comps.reshape(-1, g, comps.shape[-1]), jnp.asarray(spec.reward_weights), eps=spec.eps,
        mask_bg=batch["valid"].reshape(-1, g)).reshape(-1)
    advantages = jnp.broadcast_to(adv_b[:, None], mask.shape) * mask
    returns = advantages
  else:
    seq_scores = scores - kl_coef * jnp.sum(kl_bt, axis=1)
    adv_b = _group_estimate(spec, seq_scores, batch["valid"], batch.get("greedy_scores"),
                            jnp.sum(batch["mask"], axis=1))
    advantages = jnp.broadcast_to(adv_b[:, None], mask.shape) * mask
    returns = advantages
  if spec.whiten:
    advantages = adv_ops.whiten(advantages, mask)
  return advantages * mask, returns * mask, kl_bt
