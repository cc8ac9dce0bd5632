"""The RL objective, assembled from `rljax.ops` for one micro-batch.

`LossSpec` (`rljax.train.config.specs`) is the static, hashable slice of the config that
the loss needs. The loss returns *sums*: every term is `sum / global_denominator` where
the denominators were computed over the whole minibatch beforehand, so gradients
accumulated over micro-batches equal the full-minibatch gradient exactly (a loss scale
that does not depend on the micro-batch split: verl-project/verl#5625).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from rljax.models.logprobs import (
  logprobs_and_entropy_from_hidden,
  token_logprobs_and_entropy,
  token_logprobs_and_sum_sq,
)
from rljax.ops import aggregate as agg
from rljax.ops import kl as kl_ops
from rljax.ops import value as value_ops
from rljax.ops.off_policy import decoupled_ppo_loss
from rljax.ops.policy_loss import apply_policy_loss
from rljax.ops.policy_loss_common import clip_by_probability_bt
from rljax.train.config.specs import LossSpec
from rljax.train.update import packing, routing
from rljax.train.update.stages import enabled


def full_sequence(batch):
  """Prompt + completion as one left-padded sequence with positions.

  Positions count real tokens only, so they match what the sampler used.
  """
  tokens = jnp.concatenate([batch["prompt_tokens"], batch["tokens"]], axis=1)
  attention = jnp.concatenate(
      [batch["prompt_mask"], jnp.ones_like(batch["tokens"])], axis=1).astype(jnp.int32)
  positions = jnp.maximum(jnp.cumsum(attention, axis=1) - 1, 0)
  return tokens, positions, attention


def policy_forward(model, batch, *, temperature, pack_groups: int = 0, replay: bool = False):
  """Per-token log-probs and entropies of the completion tokens: ([B,T], [B,T]).

  With `pack_groups` > 0 the batch carries a `rljax.train.update.packing` layout (`pack_*`
  keys, `pack_groups` groups) and the transformer runs on the packed rows, the lm head and the
  log-softmax on the gathered completion positions, with the same values as padded.
  With `replay` and the sampler's `routes` in the batch (a MoE policy), every MoE layer uses
  the sampler's experts (`rljax.train.update.routing`; padded layout).
  """
  tokens, positions, attention = full_sequence(batch)
  if replay:   # a MoE policy's rollout: the sampler's experts (a dense run never gets here)
    return routing.routed_logprobs(model, tokens, positions, attention,
                                   prompt_len=batch["prompt_tokens"].shape[1],
                                   temperature=temperature,
                                   replay_ids=routing.replay_ids(batch, replay))[:2]
  if not pack_groups:   # no layout: the padded computation
    return token_logprobs_and_entropy(
        model, tokens, positions, attention,
        prompt_len=batch["prompt_tokens"].shape[1], temperature=temperature)
  p_tokens, p_positions, p_valid, segment = packing.packed_inputs(tokens, positions, batch,
                                                                   pack_groups)
  hidden = model.hidden_states(p_tokens, positions=p_positions, attention_mask=p_valid,
                               segment_ids=segment)
  return logprobs_and_entropy_from_hidden(
      packing.unpack_hidden(hidden, batch, pack_groups), batch["tokens"],
      model.logits_from_hidden, temperature=temperature)


def policy_sum_sq_forward(model, batch, *, temperature):
  """Per-token log-probs and Σ_v π_v² of the completion tokens: ([B,T], [B,T])."""
  tokens, positions, attention = full_sequence(batch)
  return token_logprobs_and_sum_sq(
      model, tokens, positions, attention,
      prompt_len=batch["prompt_tokens"].shape[1], temperature=temperature)


def value_forward(critic, batch):
  """Critic values V(s_t) for each completion token t: [B,T] (state before token t)."""
  tokens, positions, attention = full_sequence(batch)
  prompt_len = batch["prompt_tokens"].shape[1]
  values_bs = critic(tokens, positions=positions, attention_mask=attention)
  return values_bs[:, prompt_len - 1:-1]


def policy_terms(spec: LossSpec, logp, batch):
  """Per-token policy loss [B,T] and diagnostics of the run's loss (`spec.policy`, built by
  the registry's `policy_loss_spec`); Clip-Cov draws its tokens with the rows' key. With
  stale samples and `algo.off_policy_correction='decoupled'`, AReaL's decoupled PPO
  (`rljax.ops.off_policy.decoupled_ppo_loss`): the recomputed old log-probs are the
  proximal policy, the sampler's the behaviour policy."""
  if spec.decoupled_cap is not None:
    kwargs = dict(spec.policy.kwargs)
    return decoupled_ppo_loss(
        logp, batch["old_logp"], batch["sampler_logp"], batch["advantages"], batch["mask"],
        eps_low=kwargs["eps_low"], eps_high=kwargs["eps_high"], dual_clip=kwargs["dual_clip"],
        ratio_level=kwargs["ratio_level"], behav_cap=spec.decoupled_cap)   # inf: no cap
  return apply_policy_loss(spec.policy, logp, batch["old_logp"], batch["advantages"],
                           batch["mask"], key=jax.random.wrap_key_data(batch["rng"][0]))


def denominators(spec: LossSpec, mask):
  """Global normalisers of one minibatch (computed before splitting into micro-batches)."""
  zeros = jnp.zeros(mask.shape, jnp.float32)
  _, policy = agg.aggregate_parts(zeros, mask, spec.loss_agg, max_len=spec.max_len)
  _, tokens = agg.aggregate_parts(zeros, mask, "token_mean")
  # An empty minibatch (e.g. everything filtered) has zero sums; 1 avoids 0/0.
  return {"policy": jnp.where(policy > 0, policy, 1.0), "tokens": jnp.maximum(tokens, 1.0)}


def _sum(per_token, mask, mode, spec):
  return agg.aggregate_parts(per_token, mask, mode, max_len=spec.max_len)[0]


# Metrics key of the per-token [b, T] outputs of the update step: always there, {} unless
# `old_logp_from_update` (then its old log-probs and entropies: the rollout statistics
# need them).
TOKEN_OUTPUTS = "per_token"


class Micro(NamedTuple):
  """What the loss terms of one micro-batch read: the static spec, the models, the batch,
  the minibatch denominators, its float mask and the current policy's outputs [b, T]."""

  spec: LossSpec
  actor: object
  critic: object
  batch: dict
  denom: dict
  mask: object
  logp: object
  entropy: object

  def token_sum(self, per_token):
    """Σ over the micro-batch's tokens (a token metric's share: divided by the minibatch's
    token count after the micro-batches are summed)."""
    return _sum(per_token, self.mask, "token_mean", self.spec)

  def policy_mean(self, per_token):
    """The micro-batch's share of the minibatch's `loss_agg` mean."""
    return _sum(per_token, self.mask, self.spec.loss_agg, self.spec) / self.denom["policy"]


def _entropy_bonus(m: Micro, loss):
  return loss - m.spec.entropy_coef * m.policy_mean(m.entropy), {}


def _kl_to_reference(m: Micro, loss):
  spec, batch = m.spec, m.batch
  if spec.kl_is_correction:
    kl_bt = kl_ops.is_corrected_kl(m.logp, batch["old_logp"], batch["ref_logp"], m.mask,
                                   kind=spec.kl_estimator)
  else:
    kl_bt = kl_ops.kl_estimate(m.logp, batch["ref_logp"], spec.kl_estimator)
  kl = batch["kl_coef"] * _sum(kl_bt, m.mask, spec.loss_agg, spec) / m.denom["policy"]
  return loss + kl, {"kl_ref": m.token_sum(kl_bt)}


def _value_loss(m: Micro, loss):
  values = value_forward(m.critic, m.batch)
  vf_bt, vf_diag = value_ops.value_loss(values, m.batch["old_values"], m.batch["returns"],
                                        m.mask, clip_range=m.spec.value_clip)
  loss = loss + m.spec.vf_coef * m.token_sum(vf_bt) / m.denom["tokens"]
  return loss, {"value_loss": m.token_sum(vf_bt),
                "value_clip_frac": m.token_sum(vf_diag.clipfrac_bt)}


def _ptx(m: Micro, loss):
  nll_sum, _ = sft_nll(m.actor, m.batch["ptx"])
  loss = loss + m.spec.ptx_coef * nll_sum / m.denom["ptx_tokens"]
  return loss, {"ptx_nll": nll_sum / m.denom["ptx_tokens"] * m.denom["tokens"]}


def _ptx_tokens(minibatch):
  return jnp.maximum(jnp.sum(minibatch["ptx"]["mask"]), 1.0)


# The minibatch-wide normalisers of optional terms, (the LossSpec field that turns the term
# on, (name, normaliser(minibatch))): the ptx demonstrations' token count
TERM_DENOMINATORS = (("ptx_coef", ("ptx_tokens", _ptx_tokens)),)


def minibatch_denominators(spec: LossSpec, minibatch):
  """`denominators` of the minibatch's loss mask, and the normalisers of the terms `spec`
  turns on (`TERM_DENOMINATORS`; the minibatch has the ptx demonstrations with `ptx_coef`,
  `Epochs.minibatch`)."""
  denom = denominators(spec, minibatch["mask"])
  denom.update({name: count(minibatch) for name, count in enabled(spec, TERM_DENOMINATORS)})
  return denom


def _token_outputs(m: Micro, loss):
  return loss, {TOKEN_OUTPUTS: {"old_logp": m.batch["old_logp"],
                                "entropy": jax.lax.stop_gradient(m.entropy)}}


# The optional terms, (the LossSpec field that turns one on, term(micro, loss) -> (loss,
# metric sums)), in the order they are added to the policy-gradient loss
TERMS = (("entropy_coef", _entropy_bonus), ("kl_in_loss", _kl_to_reference),
         ("use_critic", _value_loss), ("ptx_coef", _ptx),
         ("old_logp_from_update", _token_outputs))


def micro_loss(spec: LossSpec, actor, critic, batch, denom):
  """Loss of one micro-batch, normalised by the minibatch denominators: the policy
  gradient's, MoE load balancing, and the `TERMS` the spec turns on.

  Returns:
    (loss scalar, metric sums): divide each metric sum by `denom["tokens"]` (token
    metrics) after summing over micro-batches; `metrics[TOKEN_OUTPUTS]` is {}, or with
    `spec.old_logp_from_update` this micro-batch's old log-probs and entropies [b, T].
  """
  mask = batch["mask"].astype(jnp.float32)
  logp, entropy, routed = current_policy(spec, actor, batch)
  if spec.old_logp_from_update:
    # One update per rollout: the policy before this step is the one that is being
    # differentiated, so π_old = sg(π_θ) exactly (ratio 1, same gradient as recomputing).
    batch = {**batch, "old_logp": jax.lax.stop_gradient(logp)}
  m = Micro(spec, actor, critic, batch, denom, mask, logp, entropy)
  loss_bt, diag = policy_terms(spec, logp, batch)
  weighted = loss_bt * batch["token_weights"] * batch["is_weights"]
  pg = _sum(weighted, mask, spec.loss_agg, spec) / denom["policy"]
  loss = spec.pg_coef * pg
  metrics = {
      "pg_loss": pg * denom["tokens"], "entropy": m.token_sum(entropy),
      "clip_low": m.token_sum(diag.clip_low_bt), "clip_high": m.token_sum(diag.clip_high_bt),
      "clip_dual": m.token_sum(diag.clip_dual_bt), "ratio": m.token_sum(diag.ratio_bt),
      "approx_kl_old": m.token_sum(diag.approx_kl_bt), TOKEN_OUTPUTS: {},
  }
  by_prob = clip_by_probability_bt(batch["old_logp"], diag.clip_low_bt, diag.clip_high_bt, mask)
  metrics.update({k: m.token_sum(v) for k, v in by_prob.items()})
  if routed is not None:
    loss = loss + moe_balancing(spec, routed, batch, mask, denom, metrics)
  for term in enabled(spec, TERMS):
    loss, term_metrics = term(m, loss)
    metrics.update(term_metrics)
  return loss, metrics


def current_policy(spec: LossSpec, actor, batch):
  """(log-probs [b,T], entropies [b,T], the MoE layers' `Routing` when the loss has
  load-balancing terms, else None) of the policy being differentiated."""
  if not (spec.moe_aux_loss_coef or spec.moe_z_loss_coef):
    return policy_forward(actor, batch, temperature=spec.temperature,
                          pack_groups=spec.pack_groups, replay=spec.routing_replay) + (None,)
  tokens, positions, attention = full_sequence(batch)   # padded layout
  return routing.routed_logprobs(actor, tokens, positions, attention,
                                 prompt_len=batch["prompt_tokens"].shape[1],
                                 temperature=spec.temperature,
                                 replay_ids=routing.replay_ids(batch, spec.routing_replay))


def moe_balancing(spec: LossSpec, routed, batch, mask, denom, metrics):
  """The load-balancing terms of one micro-batch (`routing.balancing_terms`), weighted by
  its share of the minibatch's completion tokens (they are batch means, not token sums);
  their values go to `metrics` as `moe_aux_loss` and `moe_z_loss`."""
  aux, z = routing.balancing_terms(routed, routing.token_mask(batch))
  share = jnp.sum(mask) / denom["tokens"]
  metrics["moe_aux_loss"], metrics["moe_z_loss"] = aux * jnp.sum(mask), z * jnp.sum(mask)
  return share * (spec.moe_aux_loss_coef * aux + spec.moe_z_loss_coef * z)


def sft_nll(model, demo):
  """Negative log-likelihood of demonstration completions: (sum over tokens, token count).

  Used for the SFT cold start and the ptx term (InstructGPT's pre-training mix).
  """
  logp, _ = policy_forward(model, demo, temperature=1.0)
  mask = demo["mask"].astype(jnp.float32)
  return -jnp.sum(logp * mask), jnp.sum(mask)


