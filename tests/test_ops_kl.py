"""KL estimators (k1/k2/k3/low_var_kl/abs, straight-through), KL-in-reward, controllers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.ops.kl import (
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    kl_estimate,
    kl_penalized_rewards,
)

NP_KL = {  # Schulman (2020) "Approximating KL Divergence", d = logπ − logπ_ref.
    "k1": lambda d: d,
    "abs": lambda d: np.abs(d),
    "k2": lambda d: 0.5 * d**2,
    "k3": lambda d: np.exp(-np.clip(d, -20, 20)) - 1 + np.clip(d, -20, 20),
    "low_var_kl": lambda d: np.clip(np.exp(-np.clip(d, -20, 20)) - 1 + np.clip(d, -20, 20), -10, 10),
}


def _pair(seed=0):
  rng = np.random.default_rng(seed)
  logp = rng.uniform(-4, -0.05, (3, 5)).astype(np.float32)
  ref = (logp + rng.normal(0, 1.0, (3, 5))).astype(np.float32)
  return logp, ref


@pytest.mark.parametrize("kind", sorted(KL_ESTIMATORS))
def test_estimators_match_numpy(kind):
  logp, ref = _pair()
  logp[0, 0], ref[0, 0] = -0.1, -25.0  # d = 24.9: exercises the ±20 input clamp
  logp[0, 1], ref[0, 1] = -16.0, -0.1  # d = -15.9: k3 = e^15.9 ..., low_var_kl clamps at 10
  got = kl_estimate(logp, ref, kind)
  np.testing.assert_allclose(got, NP_KL[kind]((logp - ref).astype(np.float64)), rtol=2e-5, atol=1e-5)
  if kind == "low_var_kl":
    assert float(got[0, 1]) == 10.0


def test_k1_and_k3_are_unbiased_for_the_exact_kl():
  # E_{x~p}[k(x)] over a categorical equals KL(p‖q) exactly for k1 and k3 (enumeration).
  p = np.array([0.5, 0.3, 0.15, 0.05], np.float32)
  q = np.array([0.25, 0.25, 0.25, 0.25], np.float32)
  exact = float(np.sum(p * np.log(p / q)))
  logp, logq = jnp.log(p)[None], jnp.log(q)[None]
  for kind in ("k1", "k3", "low_var_kl"):
    np.testing.assert_allclose(jnp.sum(p * kl_estimate(logp, logq, kind)), exact, rtol=1e-5)


@pytest.mark.parametrize("kind", sorted(KL_ESTIMATORS))
def test_straight_through_value_of_kind_gradient_of_k2(kind):
  logp, ref = _pair(1)
  value = kl_estimate(logp, ref, kind, straight_through=True)
  np.testing.assert_allclose(value, kl_estimate(logp, ref, kind), rtol=1e-6)
  grad = jax.grad(lambda lp: jnp.sum(kl_estimate(lp, ref, kind, straight_through=True)))(logp)
  np.testing.assert_allclose(grad, logp - ref, rtol=1e-5, atol=1e-6)  # ∂(½d²)/∂logp = d


def test_mask_zeroes_output_and_keeps_gradients_finite():
  logp, ref = _pair(2)
  mask = np.ones_like(logp)
  mask[1, 3:] = 0
  mask[2] = 0
  bad = np.where(mask > 0, ref, -3e38).astype(np.float32)
  for kind in KL_ESTIMATORS:
    out = kl_estimate(logp, bad, kind, mask=mask)
    np.testing.assert_array_equal(out, kl_estimate(logp, ref, kind, mask=mask))
    assert np.all(np.asarray(out)[mask == 0] == 0)
    g = jax.grad(lambda lp, kind=kind: jnp.sum(kl_estimate(lp, bad, kind, mask=mask)))(logp)
    assert np.all(np.isfinite(g)) and np.all(np.asarray(g)[mask == 0] == 0)


def test_unknown_kind_lists_valid_kinds():
  with pytest.raises(ValueError, match="low_var_kl"):
    kl_estimate(jnp.zeros((1, 1)), jnp.zeros((1, 1)), "k4")


def np_kl_penalized_rewards(scores, kl, mask, beta):
  """Per-token KL in the reward (arXiv:2203.02155 Eq. 2 per token; REINFORCE++,
  arXiv:2501.03262 Eq. 1): r_t = 1[t = last real token]·R − β·KL_t, on real tokens only."""
  out = np.zeros_like(kl)
  for i in range(kl.shape[0]):
    idx = np.nonzero(mask[i])[0]
    out[i, idx] = -beta * kl[i, idx]
    if idx.size:
      out[i, idx[-1]] += scores[i]
  return out


def test_kl_penalized_rewards_matches_seed001_eq1():
  rng = np.random.default_rng(3)
  kl = rng.normal(size=(4, 5)).astype(np.float32)
  mask = np.array([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0], [0, 0, 0, 0, 0]], np.float32)
  scores = np.array([1.0, -1.0, 0.5, 7.0], np.float32)
  got = kl_penalized_rewards(scores, kl, mask, beta=0.1)
  np.testing.assert_allclose(got, np_kl_penalized_rewards(scores, kl, mask, 0.1), rtol=1e-6)
  # hand-computed row 1: [−0.1·kl0, −1 − 0.1·kl1, 0, 0, 0]
  np.testing.assert_allclose(got[1, :2], [-0.1 * kl[1, 0], -1.0 - 0.1 * kl[1, 1]], rtol=1e-6)
  # jit with a traced beta (a controller's value)
  jitted = jax.jit(kl_penalized_rewards)(scores, kl, mask, beta=jnp.float32(0.1))
  np.testing.assert_allclose(jitted, got, rtol=1e-6)


def test_adaptive_kl_controller_hand_computed_updates():
  # The controller of Ziegler et al. 2019 (arXiv:1909.08593 §2.2), init 0.15, target 6,
  # horizon 10000, n_steps 256.
  c = AdaptiveKLController(value=0.15, target=6.0, horizon=10000.0)
  up = c.update(9.0, 256)    # 9/6 − 1 = 0.5 → clipped to +0.2
  np.testing.assert_allclose(up.value, 0.15 * (1 + 0.2 * 256 / 10000), rtol=1e-6)
  np.testing.assert_allclose(up.value, 0.150768, rtol=1e-6)
  down = c.update(1.0, 256)  # 1/6 − 1 = −0.833 → clipped to −0.2
  np.testing.assert_allclose(down.value, 0.149232, rtol=1e-6)
  mid = c.update(6.6, 256)   # 0.1, inside the clip
  np.testing.assert_allclose(mid.value, 0.15 * 1.00256, rtol=1e-6)
  assert up.target == 6.0 and up.horizon == 10000.0
  # Pure state under jit + scan: two up-steps then one down-step.
  def step(ctrl, kl):
    ctrl = ctrl.update(kl, 256)
    return ctrl, ctrl.value
  c0 = AdaptiveKLController(jnp.float32(0.15), jnp.float32(6.0), jnp.float32(10000.0))
  _, values = jax.jit(lambda c: jax.lax.scan(step, c, jnp.array([9.0, 100.0, 0.0])))(c0)
  expected = 0.15 * np.cumprod([1.00512, 1.00512, 0.99488])
  np.testing.assert_allclose(values, expected, rtol=1e-6)
  assert AdaptiveKLController().value == 0.001  # verl defaults


def test_fixed_kl_controller_never_changes():
  c = FixedKLController(0.04)
  assert c.update(100.0, 10).value == 0.04
  assert jax.jit(lambda c: c.update(1.0, 1))(c).value == pytest.approx(0.04)
