"""Mixture-of-experts routing: the load-balancing losses (Switch auxiliary loss, ST-MoE router
z-loss) and the routing metrics (flip rate between two routings, expert load).

Pure functions of router logits [..., E] and expert ids [..., k] (the `Routing` a MoE block
returns, `rljax.models.moe`), with a token mask [...]. Leading dimensions are pooled: pass
one layer's [B,T,...] arrays for per-layer values, or `vmap` over a layer axis.
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp


class LoadBalanceStats(NamedTuple):
  """Diagnostics of `switch_load_balancing_loss`.

  Attributes:
    dispatch_share: f_e, float32 [E], the share of the routed (token, expert) pairs that go
      to expert e (sums to 1).
    prob_share: P_e, float32 [E], the mean router probability of expert e (sums to 1).
  """

  dispatch_share: jax.Array
  prob_share: jax.Array


def _token_mask(mask, ids):
  """The token mask as float32, broadcast to the ids' token dimensions ids.shape[:-1]."""
  return jnp.broadcast_to(mask, ids.shape[:-1]).astype(jnp.float32)


def expert_counts(expert_ids, mask, *, num_experts: int):
  """Tokens routed to each expert, n_e = Σ_t m_t·[e ∈ ids_t].

  Args:
    expert_ids: int [..., k], distinct ids per token.
    mask: [...] (broadcastable to expert_ids.shape[:-1]), 1 = real token.
    num_experts: E.
  Returns:
    float32 [E].
  """
  m = _token_mask(mask, expert_ids)
  one_hot = jax.nn.one_hot(expert_ids, num_experts, dtype=jnp.float32)  # [..., k, E]
  return jnp.einsum("...ke,...->e", one_hot, m)


def switch_load_balancing_loss(router_logits, expert_ids, mask):
  """Switch Transformer auxiliary load-balancing loss, N·Σ_e f_e·P_e.

  Fedus, Zoph & Shazeer 2021, "Switch Transformers: Scaling to Trillion Parameter Models
  with Simple and Efficient Sparsity", arXiv:2101.03961, Eq. 4-6: f_e is the fraction of
  tokens dispatched to expert e (Eq. 5), P_e = (1/T) Σ_t p_e(x_t) the mean router
  probability (Eq. 6), loss = N·Σ_e f_e·P_e (Eq. 4, without the α), 1 at a uniform routing.
  Only P_e carries a gradient (f_e counts an argmax).

  Args:
    router_logits: float [..., E].
    expert_ids: int [..., k], the experts each token was dispatched to.
    mask: [...] (broadcastable to the tokens' shape), 1 = real token.
  Returns:
    (loss, float32 scalar; `LoadBalanceStats`).
  Note:
    with top-k routing f_e counts the T·k (token, expert) pairs, f_e = n_e / (k·Σ_t m_t),
    so Σ f_e = 1 as in the paper's top-1 case. `transformers`' `load_balancing_loss_func`
    divides by the token count only (Σ f_e = k): its value is k times this one, and it
    pools every layer's f and P before the product (here one call per layer).
    A product of two batch means: computed per (micro)batch, not token-additive.
  """
  chex.assert_equal_shape_prefix([router_logits, expert_ids], router_logits.ndim - 1)
  num_experts = router_logits.shape[-1]
  m = _token_mask(mask, expert_ids)
  tokens = jnp.maximum(jnp.sum(m), 1.0)
  f = expert_counts(expert_ids, m, num_experts=num_experts) / (tokens * expert_ids.shape[-1])
  probs = jax.nn.softmax(router_logits.astype(jnp.float32), axis=-1)  # [..., E]
  p = jnp.einsum("...e,...->e", probs, m) / tokens
  return num_experts * jnp.sum(f * p), LoadBalanceStats(f, p)


def router_z_loss(router_logits, mask):
  """ST-MoE router z-loss per token, (log Σ_j exp z_j)².

  Zoph et al. 2022, "ST-MoE: Designing Stable and Transferable Sparse Expert Models",
  arXiv:2202.08906, Eq. 5: L_z = (1/B) Σ_i (log Σ_j e^{x_j^(i)})², which keeps the router
  logits small. Here per token; its masked mean over tokens is the paper's L_z.

  Args:
    router_logits: float [..., E].
    mask: [...], 1 = real token.
  Returns:
    float32 [...], 0 at masked tokens.
  """
  chex.assert_equal_shape_prefix([router_logits, mask], mask.ndim)
  lse = jax.nn.logsumexp(router_logits.astype(jnp.float32), axis=-1)
  return jnp.where(mask > 0, jnp.square(lse), 0.0)


def routing_flips(ids_a, ids_b):
  """Whether two routings of each token use different expert sets (order ignored).

  Args:
    ids_a, ids_b: int [..., k], distinct ids per token (a top-k).
  Returns:
    bool [...]: True where the sets differ (a permutation of the same experts is no flip).
  """
  chex.assert_equal_shape([ids_a, ids_b])
  shared = jnp.any(ids_a[..., :, None] == ids_b[..., None, :], axis=-1)  # [..., k]
  return ~jnp.all(shared, axis=-1)


def routing_flip_rate(ids_a, ids_b, mask):
  """The share of (token, layer) pairs whose expert set differs between two routings.

  The routing mismatch between a sampler and a trainer (Ma et al. 2025, "Stabilizing MoE
  Reinforcement Learning by Aligning Training and Inference Routers", arXiv:2510.11370,
  which reports it per token and layer): Σ m·flip / Σ m over all leading dimensions.

  Args:
    ids_a, ids_b: int [..., k] (e.g. [L,B,T,k] for every MoE layer).
    mask: broadcastable to ids_a.shape[:-1] (e.g. the token mask [B,T]), 1 = counted.
  Returns:
    float32 scalar in [0, 1] (0 when the mask is empty).
  """
  m = _token_mask(mask, ids_a)
  flips = routing_flips(ids_a, ids_b).astype(jnp.float32)
  return jnp.sum(flips * m) / jnp.maximum(jnp.sum(m), 1.0)


def expert_load_max(expert_ids, mask, *, num_experts: int):
  """The largest expert's share of tokens, max_e n_e / Σ_t m_t.

  Args:
    expert_ids: int [..., k] (one layer; `vmap` over layers for a per-layer maximum).
    mask: broadcastable to expert_ids.shape[:-1], 1 = real token.
    num_experts: E.
  Returns:
    float32 scalar in [k/E, 1] (k/E: perfectly balanced; 1: one expert sees every token).
  """
  m = _token_mask(mask, expert_ids)
  counts = expert_counts(expert_ids, m, num_experts=num_experts)
  return jnp.max(counts) / jnp.maximum(jnp.sum(m), 1.0)
