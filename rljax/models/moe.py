"""Mixture-of-experts SwiGLU MLP (Qwen3-MoE, Qwen2-MoE's shared expert) with grouped matmuls,
and routing replay.

A router scores the E experts of every token, the token goes to its top k, and its output is
the routing-weighted sum of those experts' SwiGLU MLPs. The experts run as grouped matmuls
(`jax.lax.ragged_dot`) over the T·k (token, expert) pairs sorted by expert, so no expert
computes a token it was not routed. Expert weights carry the logical axis "expert"
(`rljax.parallel` maps it to the mesh axis of the same name).
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
from flax import nnx

from rljax.models.config import ModelConfig
from rljax.models.layers import MLP, dense, param, swiglu


def route_dtype(num_experts: int):
  """The compact integer dtype a sampler stores expert ids in: uint8 for E < 255, else
  int16 (its largest value, `no_route(dtype)`, stays free to mark a missing route)."""
  return jnp.uint8 if num_experts < 255 else jnp.int16


def no_route(dtype) -> int:
  """The id that marks a position without a recorded route (>= E: `route` then keeps the
  router's own top-k there)."""
  return int(jnp.iinfo(dtype).max)


class Routing(NamedTuple):
  """What a MoE block decided for each token, for the balancing losses, metrics and replay.

  Attributes:
    expert_ids: int32 [B,S,k], the experts that computed the token (the replayed ids when
      the block was given `replay_ids`, its own top-k otherwise). What a sampler records.
    own_ids: int32 [B,S,k], the block's own top-k, in decreasing router probability (equal
      to `expert_ids` without replay; compare the two for the routing flip rate).
    weights: float32 [B,S,k], the combine weights of `expert_ids`.
    router_logits: float32 [B,S,E].
  """

  expert_ids: jax.Array
  own_ids: jax.Array
  weights: jax.Array
  router_logits: jax.Array


def route(logits_te, *, k: int, norm_topk_prob: bool, replay_ids=None):
  """Softmax-then-top-k routing (Qwen3-MoE / Qwen2-MoE), optionally replaying given experts.

  p = softmax(z); the token goes to the k largest p_i with weights p_i (divided by their sum
  when `norm_topk_prob`). With `replay_ids` (routing replay, R3: Ma et al. 2025, "Stabilizing
  MoE Reinforcement Learning by Aligning Training and Inference Routers", arXiv:2510.11370)
  those experts are used instead, weighted by this router's own p at them (normalised the
  same way), so the router still receives a gradient.

  Args:
    logits_te: router logits, float32 [..., E].
    k: experts per token.
    norm_topk_prob: renormalise the k weights to sum to 1.
    replay_ids: optional int [..., k], experts to use instead of the top-k.
  Returns:
    (weights float32 [..., k], expert ids int32 [..., k], own top-k ids int32 [..., k]).
  Note:
    ties in p go to the lower expert index (`jax.lax.top_k`, as `torch.topk` on CPU).
    A token whose replayed ids are not all in [0, E) has no recorded route (e.g. the
    sentinel `NO_ROUTE` a sampler leaves at positions it never fed): it keeps this
    router's own top-k. A token's replayed ids are assumed distinct, as a top-k's are.
  """
  probs = jax.nn.softmax(logits_te.astype(jnp.float32), axis=-1)  # [..., E]
  top_p, own_ids = jax.lax.top_k(probs, k)  # [..., k]
  if replay_ids is None:
    ids, weights = own_ids, top_p
  else:
    chex.assert_equal_shape([replay_ids, own_ids])
    replay = replay_ids.astype(jnp.int32)
    recorded = jnp.all((replay >= 0) & (replay < probs.shape[-1]), axis=-1, keepdims=True)
    ids = jnp.where(recorded, replay, own_ids)
    weights = jnp.take_along_axis(probs, ids, axis=-1)
  if norm_topk_prob:
    weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
  return weights, ids.astype(jnp.int32), own_ids.astype(jnp.int32)


def sort_by_expert(ids_tk, num_experts: int):
  """The dispatch order of T·k (token, expert) pairs: grouped by expert, stable within one.

  Args:
    ids_tk: int [T,k] expert ids (values in [0, num_experts]; `num_experts` itself is a
      trailing group of pairs to skip, which `group_sizes` does not count).
    num_experts: E.
  Returns:
    (order int32 [T·k]: flat pair indices sorted by expert (pair p is token p // k);
     inverse int32 [T·k]: the position of every flat pair in `order`;
     group_sizes int32 [E]: pairs per expert).
  """
  flat = ids_tk.reshape(-1)  # [T*k]
  order = jnp.argsort(flat, stable=True).astype(jnp.int32)
  inverse = jnp.zeros_like(order).at[order].set(jnp.arange(order.size, dtype=jnp.int32))
  group_sizes = jnp.bincount(flat, length=num_experts).astype(jnp.int32)
  return order, inverse, group_sizes


def grouped_swiglu(x_td, ids_tk, weights_tk, gate_edf, up_edf, down_efd):
  """Σ_j w_tj · down_e(silu(x_t gate_e) ⊙ x_t up_e) over each token's experts e = ids[t, j].

  The T·k pairs are sorted by expert (`sort_by_expert`) and each projection is one grouped
  matmul `jax.lax.ragged_dot` (expert e multiplies its contiguous rows only), then the
  outputs are put back in pair order and summed with their weights (in float32).

  Args:
    x_td: tokens [T,D] in the compute dtype.
    ids_tk: int [T,k] expert ids in [0, E]; id E marks a pair no expert here computes (it
      contributes 0, as used by the expert-parallel dispatch).
    weights_tk: float32 [T,k] combine weights.
    gate_edf, up_edf: [E,D,F]; down_efd: [E,F,D], in the compute dtype.
  Returns:
    [T,D] in the dtype of x.
  Note:
    XLA:CPU lowers `ragged_dot` as E masked dense matmuls (E times the work of the grouped
    one); TPU and GPU have grouped kernels.
  """
  t, k = ids_tk.shape
  num_experts = gate_edf.shape[0]
  order, inverse, sizes = sort_by_expert(ids_tk, num_experts)
  x_nd = x_td[order // k]  # [T*k, D], the pairs in expert order
  h_nf = swiglu(jax.lax.ragged_dot(x_nd, gate_edf, sizes),
                jax.lax.ragged_dot(x_nd, up_edf, sizes))  # [T*k, F]
  y_nd = jax.lax.ragged_dot(h_nf, down_efd, sizes)  # [T*k, D]
  live = (ids_tk < num_experts)[..., None]  # [T,k,1]; rows past sum(sizes) are skipped
  y_tkd = jnp.where(live, y_nd[inverse].reshape(t, k, -1), 0)  # back in pair order
  out = jnp.einsum("tkd,tk->td", y_tkd.astype(jnp.float32), weights_tk.astype(jnp.float32))
  return out.astype(x_td.dtype)


class MoEMLP(nnx.Module):
  """Top-k routed SwiGLU experts, plus an optional sigmoid-gated shared expert.

  Qwen3-MoE's sparse block (Yang et al. 2025, "Qwen3 Technical Report", arXiv:2505.09388,
  as `transformers`' Qwen3MoeSparseMoeBlock computes it), and Qwen2-MoE's shared expert
  (`transformers`' Qwen2MoeSparseMoeBlock): y = Σ_j w_j·E_{e_j}(x) + σ(x·g_s)·S(x). Top-k
  gating: Shazeer et al. 2017, "Outrageously Large Neural Networks: The Sparsely-Gated
  Mixture-of-Experts Layer", arXiv:1701.06538, Eq. 3-5 (softmax before the top-k here).

  Parameters: `router` [D,E] (logical axes ("embed", "router"): every device needs all E
  scores); `gate`, `up` [E,D,F] and `down` [E,F,D] with logical axes ("expert", "embed",
  "mlp"); with a shared expert, `shared` (an `MLP`) and `shared_gate` [D,1].

  Note: the router logits and the softmax are computed in float32 whatever the compute
  dtype (`transformers` computes the logits in the hidden states' dtype), so a bf16 policy
  routes on float32 scores.
  """

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    if cfg.num_experts < 1:
      raise ValueError(f"MoEMLP needs ModelConfig.num_experts >= 1, got {cfg.num_experts}")
    d, f, e, pd = cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts, cfg.weight_dtype
    self.dtype = cfg.compute_dtype
    self.num_experts_per_tok = cfg.num_experts_per_tok
    self.norm_topk_prob = cfg.norm_topk_prob
    self.router = param(rngs, (d, e), ("embed", "router"), pd)
    self.gate = param(rngs, (e, d, f), ("expert", "embed", "mlp"), pd)
    self.up = param(rngs, (e, d, f), ("expert", "embed", "mlp"), pd)
    self.down = param(rngs, (e, f, d), ("expert", "mlp", "embed"), pd)
    self.has_shared_expert = cfg.shared_expert_intermediate_size > 0
    if self.has_shared_expert:
      self.shared = MLP(cfg.replace(intermediate_size=cfg.shared_expert_intermediate_size),
                        rngs=rngs)
      self.shared_gate = param(rngs, (d, 1), ("embed", "router"), pd)

  def routing(self, x_bsd, replay_ids=None) -> Routing:
    """The router's decision for every token (see `route`); x_bsd [B,S,D]."""
    logits = dense(x_bsd.astype(jnp.float32), self.router[...].astype(jnp.float32))  # [B,S,E]
    weights, ids, own = route(logits, k=self.num_experts_per_tok,
                              norm_topk_prob=self.norm_topk_prob, replay_ids=replay_ids)
    return Routing(expert_ids=ids, own_ids=own, weights=weights, router_logits=logits)

  def expert_weights(self):
    """(gate [E,D,F], up [E,D,F], down [E,F,D]) in the compute dtype."""
    return tuple(w[...].astype(self.dtype) for w in (self.gate, self.up, self.down))

  def shared_output(self, x_bsd):
    """σ(x·g_s)·S(x) [B,S,D], the shared expert's share (0 without one)."""
    if not self.has_shared_expert:
      return jnp.zeros_like(x_bsd)
    g = dense(x_bsd, self.shared_gate[...].astype(self.dtype))  # [B,S,1]
    return jax.nn.sigmoid(g) * self.shared(x_bsd)

  def __call__(self, x_bsd, replay_ids=None, *, experts=grouped_swiglu):
    """Applies the block.

    Args:
      x_bsd: [B,S,D] in the compute dtype.
      replay_ids: optional int [B,S,k], experts to use instead of the router's top-k
        (routing replay; the weights are this router's probabilities at them).
      experts: how the routed experts are computed, `grouped_swiglu`'s signature; e.g.
        `functools.partial(rljax.parallel.expert.expert_parallel, grouped_swiglu, mesh=...)`
        for explicit expert-parallel dispatch.
    Returns:
      (y [B,S,D], `Routing`).
    """
    chex.assert_rank(x_bsd, 3)
    b, s, d = x_bsd.shape
    r = self.routing(x_bsd, replay_ids)
    k = self.num_experts_per_tok
    y_td = experts(x_bsd.reshape(b * s, d), r.expert_ids.reshape(b * s, k),
                   r.weights.reshape(b * s, k), *self.expert_weights())
    return y_td.reshape(b, s, d) + self.shared_output(x_bsd), r
