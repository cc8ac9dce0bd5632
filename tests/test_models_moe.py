"""MoE block: the grouped-matmul dispatch equals a dense loop over experts (values and
gradients, ties, experts without tokens, a shared expert); routing replay."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tolerances import assert_close_f32

from rljax.models import ModelConfig
from rljax.models.moe import MoEMLP, route, sort_by_expert

D, F, E, K = 16, 8, 6, 2


def _cfg(**kw):
  base = dict(vocab_size=11, hidden_size=D, intermediate_size=24, num_layers=1, num_heads=2,
              num_experts=E, num_experts_per_tok=K, moe_intermediate_size=F,
              norm_topk_prob=True)
  return ModelConfig(**{**base, **kw})


def _block(cfg, seed=0, scale=0.3):
  """A block with every weight drawn at `scale` (the init's 0.02 makes routing near-uniform)."""
  block = MoEMLP(cfg, rngs=nnx.Rngs(seed))
  rng = np.random.default_rng(seed)
  state = nnx.state(block, nnx.Param)
  nnx.update(block, jax.tree.map(
      lambda x: jnp.asarray(scale * rng.standard_normal(x.shape), x.dtype), state))
  return block


def _selection(probs_te, k):
  """[T,E] bool: expert e is among the k largest p, ties to the lower index, computed by
  ranks (independent of `jax.lax.top_k`)."""
  p_i, p_j = probs_te[:, :, None], probs_te[:, None, :]
  idx = jnp.arange(probs_te.shape[-1])
  beats = (p_j > p_i) | ((p_j == p_i) & (idx[None, None, :] < idx[None, :, None]))
  return jnp.sum(beats, axis=-1) < k  # rank < k


def _dense_reference(block, x_bsd, selected_te=None):
  """Every expert applied to every token, weighted by the routing (zero where not routed)."""
  cfg_k, norm = block.num_experts_per_tok, block.norm_topk_prob
  x = x_bsd.reshape(-1, x_bsd.shape[-1])
  probs = jax.nn.softmax(x @ block.router[...], axis=-1)  # [T,E]
  if selected_te is None:
    selected_te = _selection(probs, cfg_k)
  c = jnp.where(selected_te, probs, 0.0)
  if norm:
    c = c / jnp.sum(c, axis=-1, keepdims=True)
  y = jnp.zeros_like(x)
  for e in range(block.gate.shape[0]):
    h = jax.nn.silu(x @ block.gate[e]) * (x @ block.up[e])
    y = y + c[:, e:e + 1] * (h @ block.down[e])
  if block.has_shared_expert:
    s = block.shared
    shared = (jax.nn.silu(x @ s.gate[...]) * (x @ s.up[...])) @ s.down[...]
    y = y + jax.nn.sigmoid(x @ block.shared_gate[...]) * shared
  return y.reshape(x_bsd.shape)


def _value_and_grads(fn, block, x, cot):
  """fn(block, x) -> y; returns y and the gradients of <y, cot> for params and x."""
  def loss(state, x):
    return jnp.sum(fn(nnx.merge(graphdef, state), x) * cot)
  graphdef, state = nnx.split(block)
  g_state, g_x = jax.grad(loss, argnums=(0, 1))(state, x)
  return fn(block, x), g_state, g_x


def _grouped(block, x):
  return block(x)[0]


def _assert_grouped_equals_dense(block, x, ulps=64):
  cot = jax.random.normal(jax.random.key(7), x.shape)
  y, g_state, g_x = _value_and_grads(_grouped, block, x, cot)
  y_ref, g_state_ref, g_x_ref = _value_and_grads(_dense_reference, block, x, cot)
  assert_close_f32(y, y_ref, ulps=ulps)   # 64: a gradient / reduction over tens of terms
  assert_close_f32(g_x, g_x_ref, ulps=ulps)
  flat, flat_ref = nnx.to_flat_state(g_state), dict(nnx.to_flat_state(g_state_ref))
  for path, v in flat:
    assert_close_f32(v[...], flat_ref[path][...], ulps=ulps, err_msg=str(path))
  return g_state


@pytest.mark.parametrize("norm", [True, False])
def test_grouped_equals_dense_values_and_gradients(norm):
  block = _block(_cfg(norm_topk_prob=norm))
  x = jax.random.normal(jax.random.key(1), (3, 5, D))
  g_state = _assert_grouped_equals_dense(block, x)
  assert float(jnp.max(jnp.abs(g_state["router"][...]))) > 1e-3   # the router learns


def test_grouped_equals_dense_with_ties_and_idle_experts():
  block = _block(_cfg())
  w = np.array(block.router[...])
  w[:, 1] = w[:, 2] = 0.0            # experts 1 and 2 always tie (logit exactly 0)
  w[:, 5] = -3.0                     # with x > 0, expert 5 never wins: it gets no token
  block.router.set_value(jnp.asarray(w))
  x = jnp.abs(jax.random.normal(jax.random.key(2), (2, 7, D)))
  x = x.at[0, 0].set(0.0)            # a zero token: all E probabilities tie
  ids = block(x)[1].expert_ids
  counts = np.bincount(np.asarray(ids).ravel(), minlength=E)
  assert counts[5] == 0 and counts.min() == 0
  assert np.all(np.asarray(ids[0, 0]) == [0, 1])   # a full tie goes to the lowest indices
  has = lambda e: np.any(np.asarray(ids) == e, axis=-1)
  assert np.all(~has(2) | has(1)) and np.any(has(1))   # 1 and 2 tie: never 2 without 1
  _assert_grouped_equals_dense(block, x)


def test_shared_expert_equals_dense():
  block = _block(_cfg(shared_expert_intermediate_size=12, norm_topk_prob=False))
  x = jax.random.normal(jax.random.key(3), (2, 4, D))
  _assert_grouped_equals_dense(block, x)


def test_sort_by_expert_hand_worked():
  ids = jnp.array([[2, 0], [0, 1], [2, 3]])       # pairs 0..5 -> experts 2 0 0 1 2 3
  order, inverse, sizes = sort_by_expert(ids, 4)
  np.testing.assert_array_equal(order, [1, 2, 3, 0, 4, 5])
  np.testing.assert_array_equal(sizes, [2, 1, 2, 1])
  np.testing.assert_array_equal(np.asarray(order)[np.asarray(inverse)], np.arange(6))
  _, _, sizes = sort_by_expert(jnp.array([[0, 4], [4, 1]]), 4)   # id E: skipped
  np.testing.assert_array_equal(sizes, [1, 1, 0, 0])


def test_route_hand_worked():
  logits = jnp.log(jnp.array([[0.1, 0.5, 0.15, 0.25]]))
  w, ids, own = route(logits, k=2, norm_topk_prob=False)
  np.testing.assert_array_equal(ids, [[1, 3]])
  np.testing.assert_allclose(w, [[0.5, 0.25]], rtol=1e-6)
  w, ids, own = route(logits, k=2, norm_topk_prob=True, replay_ids=jnp.array([[2, 0]]))
  np.testing.assert_array_equal(ids, [[2, 0]])
  np.testing.assert_array_equal(own, [[1, 3]])
  np.testing.assert_allclose(w, [[0.6, 0.4]], rtol=1e-6)   # 0.15, 0.1 renormalised
  # a token without a recorded route (an id >= E: the sampler's sentinel) keeps its own
  two = jnp.concatenate([logits, logits])
  w, ids, own = route(two, k=2, norm_topk_prob=True,
                      replay_ids=jnp.array([[2, 0], [255, 255]], jnp.uint8))
  np.testing.assert_array_equal(ids, [[2, 0], [1, 3]])
  np.testing.assert_allclose(w, [[0.6, 0.4], [2 / 3, 1 / 3]], rtol=1e-6)


def test_replay_of_own_ids_changes_nothing():
  block = _block(_cfg())
  x = jax.random.normal(jax.random.key(4), (2, 6, D))
  y, routing = block(x)
  y_replay, routing_replay = block(x, replay_ids=routing.expert_ids)
  np.testing.assert_array_equal(y_replay, y)
  np.testing.assert_array_equal(routing_replay.weights, routing.weights)
  cot = jax.random.normal(jax.random.key(5), x.shape)
  _, g, _ = _value_and_grads(_grouped, block, x, cot)
  _, g_replay, _ = _value_and_grads(
      lambda b, x: b(x, replay_ids=routing.expert_ids)[0], block, x, cot)
  for (path, v), (_, v_replay) in zip(nnx.to_flat_state(g), nnx.to_flat_state(g_replay)):
    assert_close_f32(v_replay[...], v[...], ulps=16, err_msg=str(path))


def test_replay_of_other_ids_uses_them_and_trains_the_router():
  block = _block(_cfg())
  x = jax.random.normal(jax.random.key(6), (2, 6, D))
  y, routing = block(x)
  other = (routing.expert_ids + 1) % E                       # every token's experts change
  y_other, routing_other = block(x, replay_ids=other)
  assert float(jnp.max(jnp.abs(y_other - y))) > 1e-2
  np.testing.assert_array_equal(routing_other.expert_ids, other)
  np.testing.assert_array_equal(routing_other.own_ids, routing.own_ids)
  selected = jax.nn.one_hot(other.reshape(-1, K), E).sum(1) > 0   # [T,E]
  assert_close_f32(y_other, _dense_reference(block, x, selected), ulps=64)
  cot = jax.random.normal(jax.random.key(8), x.shape)
  _, g, _ = _value_and_grads(lambda b, x: b(x, replay_ids=other)[0], block, x, cot)
  assert float(jnp.max(jnp.abs(g["router"][...]))) > 1e-3


def test_config_errors_name_the_field():
  with pytest.raises(ValueError, match="num_experts_per_tok"):
    _cfg(num_experts_per_tok=E + 1)
  with pytest.raises(ValueError, match="moe_intermediate_size"):
    _cfg(moe_intermediate_size=0)
  with pytest.raises(ValueError, match="decoder_sparse_step"):
    _cfg(decoder_sparse_step=0)
  cfg = _cfg(num_layers=4, decoder_sparse_step=2, mlp_only_layers=[3])
  assert [cfg.is_moe_layer(i) for i in range(4)] == [False, True, False, False]
  assert not _cfg(num_experts=0).is_moe_layer(0)
