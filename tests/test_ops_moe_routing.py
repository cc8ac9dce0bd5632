"""MoE routing kernels: Switch load-balancing loss and ST-MoE z-loss against NumPy written from
the equations, `transformers`' loss and hand-worked values; flip rate and expert load."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from tolerances import assert_close_f32
from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

from rljax.ops.moe_routing import (
  expert_counts,
  expert_load_max,
  router_z_loss,
  routing_flip_rate,
  routing_flips,
  switch_load_balancing_loss,
)


def _random_routing(seed, t=40, e=6, k=2):
  rng = np.random.default_rng(seed)
  logits = (2.0 * rng.standard_normal((t, e))).astype(np.float32)
  ids = np.argsort(-logits, axis=-1, kind="stable")[:, :k]
  mask = (rng.random(t) < 0.7).astype(np.float32)
  return logits, ids, mask


def _switch_numpy(logits, ids, mask):
  """Switch Eq. 4-6 with loops: f_e over the T·k routed pairs, P_e the mean probability."""
  t, e = logits.shape
  k = ids.shape[1]
  z = logits.astype(np.float64)
  p = np.exp(z - z.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  real = [i for i in range(t) if mask[i]]
  f = np.array([sum(ids[i, j] == x for i in real for j in range(k)) for x in range(e)])
  f = f / (len(real) * k)
  big_p = np.array([sum(p[i, x] for i in real) for x in range(e)]) / len(real)
  return e * np.sum(f * big_p), f, big_p


def test_switch_loss_hand_worked():
  # probabilities (0.8, 0.2), (0.6, 0.4), (0.3, 0.7) routed to 0, 0, 1; a masked 4th token.
  probs = np.array([[0.8, 0.2], [0.6, 0.4], [0.3, 0.7], [0.01, 0.99]])
  ids = jnp.array([[0], [0], [1], [1]])
  loss, stats = switch_load_balancing_loss(jnp.log(probs), ids, jnp.array([1, 1, 1, 0]))
  np.testing.assert_allclose(stats.dispatch_share, [2 / 3, 1 / 3], rtol=1e-6)
  np.testing.assert_allclose(stats.prob_share, [1.7 / 3, 1.3 / 3], rtol=1e-6)
  np.testing.assert_allclose(loss, 2 * (2 / 3 * 1.7 / 3 + 1 / 3 * 1.3 / 3), rtol=1e-6)
  uniform, _ = switch_load_balancing_loss(jnp.zeros((4, 4)), jnp.array([[0, 1], [2, 3]] * 2),
                                          jnp.ones(4))
  np.testing.assert_allclose(uniform, 1.0, rtol=1e-6)   # balanced: exactly 1


@pytest.mark.parametrize("seed", [0, 1])
def test_switch_loss_matches_numpy_and_transformers(seed):
  logits, ids, mask = _random_routing(seed)
  loss, stats = switch_load_balancing_loss(jnp.asarray(logits), jnp.asarray(ids),
                                           jnp.asarray(mask))
  want, f, p = _switch_numpy(logits, ids, mask)
  assert_close_f32(stats.dispatch_share, f, ulps=16)
  assert_close_f32(stats.prob_share, p, ulps=64)   # a mean over tens of tokens
  assert_close_f32(loss, want, ulps=64)
  hf = load_balancing_loss_func((torch.tensor(logits),), logits.shape[1], top_k=ids.shape[1],
                                attention_mask=torch.tensor(mask)[None])
  assert_close_f32(ids.shape[1] * loss, hf.item(), ulps=64)   # HF: Σ f = k, k times ours


def test_switch_loss_gradient_is_through_probabilities_only():
  logits, ids, mask = _random_routing(2)
  grad = jax.grad(lambda z: switch_load_balancing_loss(z, jnp.asarray(ids),
                                                       jnp.asarray(mask))[0])(
      jnp.asarray(logits))
  _, f, _ = _switch_numpy(logits, ids, mask)
  p = np.asarray(jax.nn.softmax(jnp.asarray(logits, jnp.float32)), np.float64)
  # d/dz_t of N Σ_e f_e p_te / T = (N/T) p_t ⊙ (f − <f, p_t>), 0 for masked tokens
  want = logits.shape[1] / mask.sum() * p * (f - (p @ f)[:, None]) * mask[:, None]
  assert_close_f32(grad, want, ulps=64)


def test_z_loss_hand_worked_and_numpy():
  z = jnp.array([[0.0, 0.0], [np.log(3.0), 0.0], [50.0, 50.0]])
  out = router_z_loss(z, jnp.array([1, 1, 0]))
  np.testing.assert_allclose(out, [np.log(2) ** 2, np.log(4) ** 2, 0.0], rtol=1e-6)
  logits, _, mask = _random_routing(3)
  want = np.log(np.exp(logits.astype(np.float64)).sum(-1)) ** 2 * mask
  assert_close_f32(router_z_loss(jnp.asarray(logits), jnp.asarray(mask)), want, ulps=16)
  grad = jax.grad(lambda z: jnp.sum(router_z_loss(z, jnp.ones(3))))(jnp.array(z))
  np.testing.assert_allclose(grad[0], [np.log(2), np.log(2)], rtol=1e-6)   # 2·lse·softmax


def test_flips_ignore_order_and_mask():
  a = jnp.array([[0, 1], [1, 0], [2, 3], [4, 5]])
  b = jnp.array([[1, 0], [1, 2], [2, 3], [0, 1]])
  np.testing.assert_array_equal(routing_flips(a, b), [False, True, False, True])
  np.testing.assert_allclose(routing_flip_rate(a, b, jnp.array([1, 1, 1, 0])), 1 / 3)
  layers_a = jnp.stack([a, a]).reshape(2, 2, 2, 2)   # [L,B,T,k], one token mask [B,T]
  layers_b = jnp.stack([b, a]).reshape(2, 2, 2, 2)
  rate = routing_flip_rate(layers_a, layers_b, jnp.array([[1, 1], [1, 0]]))
  np.testing.assert_allclose(rate, 1 / 6)           # 1 flip in 6 counted token-layers
  assert float(routing_flip_rate(a, b, jnp.zeros(4))) == 0.0


def test_expert_load_hand_worked():
  ids = jnp.array([[0, 1], [2, 3], [0, 2], [1, 3]])
  mask = jnp.array([1, 1, 1, 0])
  np.testing.assert_array_equal(expert_counts(ids, mask, num_experts=5), [2, 1, 2, 1, 0])
  np.testing.assert_allclose(expert_load_max(ids, mask, num_experts=5), 2 / 3)
  np.testing.assert_allclose(expert_load_max(ids, jnp.ones(4), num_experts=4), 0.5)  # k/E
