"""Decoupled PPO (AReaL, arXiv:2505.24298, Eq. 5) against a NumPy reference of the
paper's equation (loss and finite-difference gradient), its relation to token-level PPO,
gradient tests, and the per-staleness mismatch metrics on a hand-computed case."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from rljax.ops import off_policy
from rljax.ops.off_policy import behaviour_weights, decoupled_ppo_loss, staleness_metrics
from rljax.ops.policy_loss import policy_loss
from rljax.ops.policy_loss_common import PolicyLossDiagnostics

LENGTHS = np.array([7, 4, 1, 0, 6])   # ragged, with an empty row
B, T = len(LENGTHS), 7
MASK = (np.arange(T)[None, :] < LENGTHS[:, None]).astype(np.float32)
GARBAGE = 1e4   # written into masked positions: must never reach an output


def _batch(seed, *, drift=0.4, staleness=1.0):
  """logp, prox_logp, behav_logp, advantages [B, T]; garbage at masked positions."""
  rng = np.random.default_rng(seed)
  prox = rng.uniform(-3.0, -0.1, (B, T))
  logp = prox + rng.normal(0.0, drift, (B, T))
  behav = prox - rng.normal(0.0, staleness, (B, T))
  adv = rng.normal(0.0, 1.0, (B, T))
  out = []
  for x in (logp, prox, behav, adv):
    out.append(np.where(MASK > 0, x, GARBAGE))
  return out


def np_decoupled_loss(logp, prox, behav, adv, mask, *, eps_low, eps_high, cap, mode, level):
  """−(π_prox/π_behav)·min(u·A, clip(u, 1−ε_low, 1+ε_high)·A), u = π_θ/π_prox, in float64,
  one token at a time; the weight capped as AReaL does ("mask": w > cap → 0)."""
  loss = np.zeros(mask.shape)
  for i in range(mask.shape[0]):
    idx = np.flatnonzero(mask[i] > 0)
    if level == "geometric" and idx.size:
      w_seq = np.exp(np.mean(prox[i, idx] - behav[i, idx]))
    for t in idx:
      w = w_seq if level == "geometric" else np.exp(prox[i, t] - behav[i, t])
      if cap is not None and w > cap:
        w = 0.0 if mode == "mask" else cap
      u = np.exp(logp[i, t] - prox[i, t])
      a = adv[i, t]
      loss[i, t] = -w * min(u * a, np.clip(u, 1 - eps_low, 1 + eps_high) * a)
  return loss


def _fd_grad(fn, x, h=1e-6):
  """Central finite differences of the scalar fn at every unmasked entry of x."""
  g = np.zeros_like(x)
  for i, t in zip(*np.nonzero(MASK), strict=True):
    up, down = x.copy(), x.copy()
    up[i, t] += h
    down[i, t] -= h
    g[i, t] = (fn(up) - fn(down)) / (2 * h)
  return g


HYPER = [
    dict(cap=None, mode="mask", level="token"),
    dict(cap=5.0, mode="mask", level="token"),
    dict(cap=2.0, mode="truncate", level="token"),
    dict(cap=1.5, mode="mask", level="geometric"),
]


@pytest.mark.parametrize("hyper", HYPER)
def test_matches_numpy_reference_loss_and_gradient(hyper):
  logp, prox, behav, adv = _batch(0)
  kw = dict(eps_low=0.2, eps_high=0.28)
  ref = np_decoupled_loss(logp, prox, behav, adv, MASK, **kw, **hyper)
  cast = [jnp.asarray(x, jnp.float32) for x in (logp, prox, behav, adv)]
  loss_fn = functools.partial(decoupled_ppo_loss, behav_cap=hyper["cap"],
                              behav_cap_mode=hyper["mode"], behav_level=hyper["level"], **kw)
  loss, diag = jax.jit(loss_fn)(*cast, MASK)
  np.testing.assert_allclose(loss, ref, rtol=2e-5, atol=1e-6)

  # The batch exercises every branch: clipped tokens on both sides, and (with a cap)
  # capped weights next to uncapped ones.
  u = np.exp(logp - prox)
  assert np.any((MASK > 0) & (adv > 0) & (u > 1.28)) and np.any((MASK > 0) & (adv < 0) & (u < 0.8))
  if hyper["cap"] is not None:
    assert 0 < float(np.sum(diag.behav_capped_bt)) < float(MASK.sum())

  grad = jax.grad(lambda lp: jnp.sum(loss_fn(lp, *cast[1:], MASK)[0]))(cast[0])
  ref_grad = _fd_grad(
      lambda lp: np.sum(np_decoupled_loss(lp, prox, behav, adv, MASK, **kw, **hyper)), logp)
  np.testing.assert_allclose(grad, ref_grad, rtol=1e-3, atol=1e-5)


def test_diagnostics_match_numpy():
  logp, prox, behav, adv = _batch(1)
  _, diag = decoupled_ppo_loss(logp, prox, behav, adv, MASK, behav_cap=3.0)
  valid = MASK > 0
  w_raw = np.exp(np.where(valid, prox - behav, 0.0))
  capped = valid & (w_raw > 3.0)
  np.testing.assert_array_equal(diag.behav_capped_bt, capped.astype(np.float32))
  np.testing.assert_allclose(diag.behav_weight_bt, np.where(capped | ~valid, 0.0, w_raw), rtol=1e-5)
  np.testing.assert_allclose(diag.behav_approx_kl_bt,
                             np.where(valid, w_raw - 1 - np.log(w_raw), 0.0), rtol=1e-4, atol=1e-6)
  u = np.exp(np.where(valid, logp - prox, 0.0))
  np.testing.assert_allclose(diag.ratio_bt, np.where(valid, u, 0.0), rtol=1e-5)
  assert diag._fields[:len(PolicyLossDiagnostics._fields)] == PolicyLossDiagnostics._fields


@pytest.mark.parametrize("ratio_level", ["token", "sequence", "sequence_token"])
@pytest.mark.parametrize("dual_clip", [None, 3.0])
def test_equals_ppo_when_behaviour_is_proximal(ratio_level, dual_clip):
  # Synchronous rollouts: π_behav = π_prox, w = 1, so the loss (and its gradient) is PPO's.
  logp, prox, _, adv = _batch(2, drift=0.6)
  kw = dict(ratio_level=ratio_level, eps_low=0.2, eps_high=0.28, dual_clip=dual_clip)
  ppo, ppo_diag = policy_loss(logp, prox, adv, MASK, **kw)
  loss, diag = decoupled_ppo_loss(logp, prox, prox, adv, MASK, **kw)
  np.testing.assert_array_equal(loss, ppo)
  for name in PolicyLossDiagnostics._fields:
    np.testing.assert_array_equal(getattr(diag, name), getattr(ppo_diag, name), err_msg=name)
  np.testing.assert_array_equal(diag.behav_weight_bt, MASK)
  np.testing.assert_array_equal(diag.behav_capped_bt, 0.0)
  np.testing.assert_array_equal(diag.behav_approx_kl_bt, 0.0)
  g = jax.grad(lambda lp: jnp.sum(decoupled_ppo_loss(lp, prox, prox, adv, MASK, **kw)[0]))
  g_ppo = jax.grad(lambda lp: jnp.sum(policy_loss(lp, prox, adv, MASK, **kw)[0]))
  np.testing.assert_array_equal(g(jnp.asarray(logp)), g_ppo(jnp.asarray(logp)))


def test_clipped_tokens_have_zero_gradient():
  # u = π_θ/π_prox: token 0 above 1 + ε_high with A > 0, token 1 below 1 − ε_low with
  # A < 0 (both clipped), token 2 inside the range; behaviour weights 2, 0.5, 3.
  prox = jnp.log(jnp.array([[0.2, 0.4, 0.3]]))
  logp = prox + jnp.log(jnp.array([[1.5, 0.6, 1.1]]))
  behav = prox - jnp.log(jnp.array([[2.0, 0.5, 3.0]]))
  adv = jnp.array([[1.0, -1.0, 2.0]])
  mask = jnp.ones((1, 3))
  loss_fn = lambda lp: jnp.sum(decoupled_ppo_loss(lp, prox, behav, adv, mask, behav_cap=None)[0])
  g = np.asarray(jax.grad(loss_fn)(logp))
  np.testing.assert_array_equal(g[0, :2], 0.0)
  # Inside the range: ∂/∂logπ_θ of −w·u·A is −w·u·A = −3 · 1.1 · 2.
  np.testing.assert_allclose(g[0, 2], -3.0 * 1.1 * 2.0, rtol=1e-5)
  # The clipped tokens still contribute their (weighted) constant: −2·1.2·1 and −0.5·0.8·(−1).
  loss, _ = decoupled_ppo_loss(logp, prox, behav, adv, mask, behav_cap=None)
  np.testing.assert_allclose(loss[0, :2], [-2.0 * 1.2, 0.5 * 0.8], rtol=1e-5)


def test_behaviour_weight_carries_no_gradient():
  logp, prox, behav, adv = (jnp.asarray(x, jnp.float32) for x in _batch(3))
  kw = dict(eps_low=0.2, eps_high=0.2, behav_cap=None)

  def total(lp, px, bh):
    return jnp.sum(decoupled_ppo_loss(lp, px, bh, adv, MASK, **kw)[0])

  g_logp, g_prox, g_behav = jax.grad(total, argnums=(0, 1, 2))(logp, prox, behav)
  np.testing.assert_array_equal(g_behav, 0.0)
  # w multiplies PPO's gradient as a constant, for π_θ and for π_prox alike (a w that
  # carried gradient would add w·L_ppo to ∂/∂log π_prox).
  w = np.where(MASK > 0, np.exp(np.asarray(prox - behav)), 0.0)
  ppo_grads = jax.grad(lambda lp, px: jnp.sum(policy_loss(lp, px, adv, MASK)[0]),
                       argnums=(0, 1))(logp, prox)
  np.testing.assert_allclose(g_logp, w * ppo_grads[0], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(g_prox, w * ppo_grads[1], rtol=1e-5, atol=1e-6)
  assert np.any(np.abs(g_logp) > 0)


def test_masked_positions_are_inert():
  logp, prox, behav, adv = _batch(4)
  loss, diag = decoupled_ppo_loss(logp, prox, behav, adv, MASK, behav_cap=None)
  for x in (loss, diag.behav_weight_bt, diag.behav_approx_kl_bt, diag.ratio_bt):
    assert np.all(np.isfinite(x))
    np.testing.assert_array_equal(np.asarray(x)[MASK == 0], 0.0)


def test_behaviour_weight_levels_and_modes():
  prox = jnp.log(jnp.array([[0.5, 0.5, 0.5, 0.5]]))
  behav = prox - jnp.log(jnp.array([[1.0, 8.0, 2.0, 99.0]]))   # w = 1, 8, 2; last masked
  mask = jnp.array([[1.0, 1.0, 1.0, 0.0]])
  w, capped, _ = behaviour_weights(prox, behav, mask, cap=5.0, cap_mode="mask")
  np.testing.assert_allclose(w, [[1.0, 0.0, 2.0, 0.0]], rtol=1e-6)
  np.testing.assert_array_equal(capped, [[False, True, False, False]])
  w, _, _ = behaviour_weights(prox, behav, mask, cap=5.0, cap_mode="truncate")
  np.testing.assert_allclose(w, [[1.0, 5.0, 2.0, 0.0]], rtol=1e-6)
  # Geometric mean of 1, 8, 2 is 16^(1/3) ≈ 2.52 for every valid token; the product is 16.
  w, _, _ = behaviour_weights(prox, behav, mask, cap=None, level="geometric")
  np.testing.assert_allclose(w, [[16 ** (1 / 3)] * 3 + [0.0]], rtol=1e-5)
  w, capped, _ = behaviour_weights(prox, behav, mask, cap=10.0, level="sequence")
  np.testing.assert_allclose(w, 0.0)
  np.testing.assert_array_equal(capped, [[True, True, True, False]])


def test_rejects_bad_hyper_parameters():
  logp, prox, behav, adv = _batch(5)
  with pytest.raises(ValueError, match="cap mode"):
    decoupled_ppo_loss(logp, prox, behav, adv, MASK, behav_cap_mode="clip")
  with pytest.raises(ValueError, match=">= 1"):
    decoupled_ppo_loss(logp, prox, behav, adv, MASK, behav_cap=0.5)
  with pytest.raises(ValueError, match="level"):
    decoupled_ppo_loss(logp, prox, behav, adv, MASK, behav_level="tokens")


# ------------------------------------------------------------------ staleness metrics

LN2 = np.log(2.0)
LAG_BT = np.array([[0, 0, 1], [2, 2, 2]])
GAP_BT = np.array([[0.0, LN2, -LN2], [2 * LN2, 0.0, 99.0]])   # log π_train − log π_behav
SMALL_MASK = np.array([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
TRAIN = np.full((2, 3), -1.0)


def test_staleness_metrics_hand_computed():
  # Valid tokens (lag, gap): (0, 0), (0, ln2), (1, −ln2), (2, 2 ln2), (2, 0).
  m = staleness_metrics(LAG_BT, TRAIN, TRAIN - GAP_BT, SMALL_MASK, max_lag=2)
  np.testing.assert_allclose(m.token_count_l, [2, 1, 2])
  np.testing.assert_allclose(m.token_share_l, [0.4, 0.2, 0.4], rtol=1e-6)
  np.testing.assert_allclose(m.logp_gap_abs_l, [LN2 / 2, LN2, LN2], rtol=1e-6)
  np.testing.assert_allclose(m.is_weight_l, [(1 + 2) / 2, 0.5, (4 + 1) / 2], rtol=1e-6)
  np.testing.assert_allclose(m.lag_mean, 1.0, rtol=1e-6)
  np.testing.assert_allclose(m.lag_max, 2.0)


def test_staleness_metrics_overflow_and_per_sequence_lags():
  # max_lag = 1: the lag-2 tokens join the last bucket; lag_max still reports 2.
  m = staleness_metrics(LAG_BT, TRAIN, TRAIN - GAP_BT, SMALL_MASK, max_lag=1)
  np.testing.assert_allclose(m.token_count_l, [2, 3])
  np.testing.assert_allclose(m.logp_gap_abs_l, [LN2 / 2, (LN2 + 2 * LN2) / 3], rtol=1e-6)
  np.testing.assert_allclose(m.is_weight_l, [1.5, (0.5 + 4 + 1) / 3], rtol=1e-6)
  np.testing.assert_allclose(m.lag_max, 2.0)
  # One lag per sequence [B], broadcast over its tokens: row 0 at lag 0, row 1 at lag 2.
  m = staleness_metrics(np.array([0, 2]), TRAIN, TRAIN - GAP_BT, SMALL_MASK, max_lag=2)
  np.testing.assert_allclose(m.token_count_l, [3, 0, 2])
  np.testing.assert_allclose(m.is_weight_l, [(1 + 2 + 0.5) / 3, 0.0, 2.5], rtol=1e-6)
  np.testing.assert_allclose(m.lag_mean, 4 / 5, rtol=1e-6)


def test_staleness_metrics_empty_mask_and_bad_bound():
  m = staleness_metrics(LAG_BT, TRAIN, TRAIN - GAP_BT, np.zeros((2, 3)), max_lag=2)
  for x in m:
    np.testing.assert_array_equal(x, 0.0)
  with pytest.raises(ValueError, match="max_lag"):
    staleness_metrics(LAG_BT, TRAIN, TRAIN, SMALL_MASK, max_lag=-1)


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 devices")
def test_staleness_metrics_global_over_devices():
  rng = np.random.default_rng(7)
  b, t, k = 16, 5, 3
  lag = rng.integers(0, k + 2, (b, t))
  train = rng.uniform(-3, -0.1, (b, t)).astype(np.float32)
  behav = (train + rng.normal(0, 0.3, (b, t))).astype(np.float32)
  mask = (rng.uniform(size=(b, t)) < 0.7).astype(np.float32)
  mask[2:4] = 0.0   # a device with no valid token
  want = staleness_metrics(lag, train, behav, mask, max_lag=k)
  mesh = jax.make_mesh((8,), ("data",), devices=jax.devices()[:8])
  fn = jax.jit(jax.shard_map(
      lambda *a: staleness_metrics(*a, max_lag=k, axis_name="data"), mesh=mesh,
      in_specs=(P("data"),) * 4, out_specs=P()))
  rows = jax.sharding.NamedSharding(mesh, P("data"))
  got = fn(*(jax.device_put(x, rows) for x in (lag, train, behav, mask)))
  for name, g, w in zip(off_policy.StalenessMetrics._fields, got, want, strict=True):
    np.testing.assert_allclose(g, w, rtol=1e-5, err_msg=name)
