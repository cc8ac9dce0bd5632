"""A mixture-of-experts policy in the trainer: routing replay of the sampler's experts, the
routing metrics of a rollout, and the load-balancing terms of the loss.

Routing replay (R3: Ma et al. 2025, "Stabilizing MoE Reinforcement Learning by Aligning
Training and Inference Routers", arXiv:2510.11370): the trainer's forwards use, per token and
MoE layer, the experts the sampler chose (`RolloutBatch.routes`), weighted by the trainer's
own router probabilities at them, so the router keeps its gradient
(`rljax.models.moe.route`). Tokens the sampler never fed keep the trainer's own routing.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rljax.models.logprobs import logprobs_and_entropy_from_hidden
from rljax.models.moe import replay_ids_of
from rljax.ops import moe_routing


def replay_ids(batch, replay: bool):
  """The decoder's `replay_ids` [L_moe, B, S, k] from the batch's recorded `routes`
  [B, S, L_moe, k] with `replay` (`algo.routing_replay`: a MoE policy, whose rollouts record
  them, and the update step's fields include them: `step.step_fields`), else None."""
  if not replay:
    return None
  return replay_ids_of(batch["routes"])


def routed_logprobs(model, tokens, positions, attention, *, prompt_len: int, temperature,
                    replay_ids=None):
  """Log-probs and entropies of the completion tokens, and the routing of every MoE layer.

  Args:
    tokens, positions, attention: [B, S] full sequences (prompt of P columns, completion).
    replay_ids: optional int [L_moe, B, S, k], the experts to use (`replay_ids`).
  Returns:
    (logp [B, T], entropy [B, T], `rljax.models.moe.Routing` [L_moe, B, S, ...] or None).
  """
  hidden, routing = model.hidden_states_routed(tokens, positions=positions,
                                               attention_mask=attention, replay_ids=replay_ids)
  s = tokens.shape[1]
  logp, entropy = logprobs_and_entropy_from_hidden(
      hidden[:, prompt_len - 1:s - 1], tokens[:, prompt_len:], model.logits_from_hidden,
      temperature=temperature)
  return logp, entropy, routing


def token_mask(batch):
  """float32 [B, S]: the real tokens of the full sequence (real prompt tokens, then the
  batch's completion `mask`: the update step's loss mask, the forwards' completion mask)."""
  return jnp.concatenate([batch["prompt_mask"], batch["mask"]], axis=1).astype(jnp.float32)


def routing_row_stats(routing, routes, mask_bs, num_experts: int) -> dict:
  """Per-row sums of the routing metrics (rows add up over micro-batches and devices).

  Args:
    routing: the trainer's `Routing` [L_moe, B, S, ...] (its `own_ids` are compared).
    routes: the sampler's recorded ids [B, S, L_moe, k] (`no_route` where none).
    mask_bs: float [B, S], the real tokens (`token_mask`).
    num_experts: E.
  Returns:
    {"flips": [B], "pairs": [B]: token-layer pairs whose expert sets differ / that were
     recorded; "load": [B, L_moe, E] tokens the trainer's own top-k sends to each expert;
     "tokens": [B]}.
  """
  own = jnp.transpose(routing.own_ids, (1, 2, 0, 3))   # [B, S, L, k]
  sampled = routes.astype(jnp.int32)
  recorded = jnp.all(sampled < num_experts, axis=-1) & (mask_bs[..., None] > 0)   # [B, S, L]
  flips = moe_routing.routing_flips(own, jnp.where(sampled < num_experts, sampled, -1))
  one_hot = jax.nn.one_hot(own, num_experts, dtype=jnp.float32)   # [B, S, L, k, E]
  return {"flips": jnp.sum(flips & recorded, axis=(1, 2)).astype(jnp.float32),
          "pairs": jnp.sum(recorded, axis=(1, 2)).astype(jnp.float32),
          "load": jnp.einsum("bslke,bs->ble", one_hot, mask_bs),
          "tokens": jnp.sum(mask_bs, axis=1)}


def routing_metrics(stats, logp_replay, logp_own, sampler_logp, completion_mask) -> dict:
  """`moe/routing_flip_rate`, `moe/expert_load_max` (the largest expert's share of tokens,
  over layers) and the sampler/trainer log-prob gap with and without replay
  (`mismatch/logp_gap_{mean,max}_{replay,no_replay}`, as `mismatch/logp_gap_*`), host floats."""
  mask = completion_mask.astype(jnp.float32)
  out = {"moe/routing_flip_rate": float(jnp.sum(stats["flips"])
                                        / jnp.maximum(jnp.sum(stats["pairs"]), 1.0)),
         "moe/expert_load_max": float(jnp.max(jnp.sum(stats["load"], axis=0))
                                      / jnp.maximum(jnp.sum(stats["tokens"]), 1.0))}
  for name, logp in (("replay", logp_replay), ("no_replay", logp_own)):
    gap = jnp.abs(logp - sampler_logp) * mask
    out[f"mismatch/logp_gap_mean_{name}"] = float(jnp.sum(gap) / jnp.maximum(jnp.sum(mask), 1))
    out[f"mismatch/logp_gap_max_{name}"] = float(jnp.max(gap))
  return out


def balancing_terms(routing, mask_bs):
  """The load-balancing terms of one micro-batch, summed over the MoE layers: (Switch
  auxiliary loss, arXiv:2101.03961 Eq. 4; ST-MoE router z-loss, arXiv:2202.08906 Eq. 5, the
  mean over the real tokens), float32 scalars (`rljax.ops.moe_routing`)."""
  aux = jax.vmap(lambda z, ids: moe_routing.switch_load_balancing_loss(z, ids, mask_bs)[0])(
      routing.router_logits, routing.expert_ids)
  z = jax.vmap(lambda z: moe_routing.router_z_loss(z, mask_bs))(routing.router_logits)
  return jnp.sum(aux), jnp.sum(z) / jnp.maximum(jnp.sum(mask_bs), 1.0)
