"""Advantage estimators against NumPy references written from the papers' equations."""

import itertools

import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tolerances import assert_close_f32

from rljax.ops import advantages as adv

RNG = np.random.default_rng(0)
B, T, G = 4, 7, 5


def _masks():
  """Contiguous masks of several lengths, one with an interior gap, one empty row."""
  m = np.zeros((B, T), np.float32)
  m[0, :7] = 1
  m[1, :3] = 1
  m[2, [0, 1, 4, 5]] = 1  # multi-turn style gap: masked tokens are skipped
  return m  # row 3 fully masked


# ---------- NumPy references (loops over the real tokens of one sequence) ----------


def np_gae(r, v, m, gamma, lam):
  adv_out = np.zeros_like(r)
  for b in range(r.shape[0]):
    idx = np.flatnonzero(m[b] > 0)
    last_adv, next_v = 0.0, 0.0
    for t in idx[::-1]:
      delta = r[b, t] + gamma * next_v - v[b, t]  # δ_t = r_t + γV_{t+1} − V_t
      last_adv = delta + gamma * lam * last_adv  # Â_t = δ_t + γλÂ_{t+1}
      adv_out[b, t] = last_adv
      next_v = v[b, t]
  return adv_out, np.where(m > 0, adv_out + v, 0.0)


def np_returns(r, m, gamma):
  out = np.zeros_like(r)
  for b in range(r.shape[0]):
    g = 0.0
    for t in np.flatnonzero(m[b] > 0)[::-1]:
      g = r[b, t] + gamma * g
      out[b, t] = g
  return out


def np_whiten(x, m, shift_mean=True):
  vals = x[m > 0]
  mean, var = (vals.mean(), vals.var()) if vals.size else (0.0, 0.0)
  out = (x - mean) / np.sqrt(var + 1e-8)
  if not shift_mean:
    out = out + mean
  return np.where(m > 0, out, 0.0)


# ---------- GAE ----------


def test_gae_hand_computed():
  # δ1 = 1 + 0 − 0.2 = 0.8; δ0 = 0 + 0.5·0.2 − 0.5 = −0.4; Â0 = −0.4 + 0.25·0.8 = −0.2.
  a, ret = adv.gae(jnp.array([[0.0, 1.0, 9.0]]), jnp.array([[0.5, 0.2, 9.0]]),
                   jnp.array([[1, 1, 0]]), gamma=0.5, lam=0.5)
  np.testing.assert_allclose(a, [[-0.2, 0.8, 0.0]], atol=1e-6)
  np.testing.assert_allclose(ret, [[0.3, 1.0, 0.0]], atol=1e-6)


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0)])
def test_gae_matches_loop_reference(gamma, lam):
  r = RNG.normal(size=(B, T)).astype(np.float32)
  v = RNG.normal(size=(B, T)).astype(np.float32)
  m = _masks()
  a, ret = adv.gae(r, v, m, gamma=gamma, lam=lam)
  ra, rret = np_gae(r, v, m, gamma, lam)
  assert_close_f32(a, ra, ulps=64)   # float32 scan vs float64 loop over T steps
  assert_close_f32(ret, rret, ulps=64)


def test_gae_lambda_gamma_one_is_monte_carlo_minus_values():
  r = RNG.normal(size=(B, T)).astype(np.float32)
  v = RNG.normal(size=(B, T)).astype(np.float32)
  m = _masks()
  a, ret = adv.gae(r, v, m, gamma=1.0, lam=1.0)
  mc = np_returns(r, m, 1.0)  # Σ_{s≥t} r_s over real tokens
  assert_close_f32(a, np.where(m > 0, mc - v, 0.0), ulps=64)   # scan vs float64 loop
  assert_close_f32(ret, mc, ulps=64)


def test_gae_fully_masked_row_is_zero_and_jits():
  a, ret = jax.jit(adv.gae, static_argnames=("gamma", "lam"))(
      jnp.ones((2, 3)), jnp.ones((2, 3)), jnp.zeros((2, 3)), gamma=1.0, lam=0.95)
  assert np.all(np.asarray(a) == 0) and np.all(np.asarray(ret) == 0)


# ---------- REINFORCE++ and whitening ----------


def test_discounted_returns_and_reinforce_pp():
  r = RNG.normal(size=(B, T)).astype(np.float32)
  m = _masks()
  assert_close_f32(adv.discounted_returns(r, m, gamma=0.9), np_returns(r, m, 0.9),
                   ulps=64)   # float32 scan vs float64 loop
  assert_close_f32(adv.reinforce_pp_advantages(r, m, gamma=0.9),
                   np_whiten(np_returns(r, m, 0.9), m), ulps=64)


def test_reinforce_pp_matches_verl_reset_form_for_contiguous_masks():
  # verl: running = r_t + γ·running; G_t = running; running *= m_t (reset after EOS).
  r = RNG.normal(size=(B, T)).astype(np.float32)
  m = _masks()
  m[2] = [1, 1, 1, 0, 0, 0, 0]
  r = np.where(m > 0, r, 0.0)
  ref = np.zeros_like(r)
  running = np.zeros(B, np.float32)
  for t in reversed(range(T)):
    running = r[:, t] + 0.7 * running
    ref[:, t] = running
    running = running * m[:, t]
  assert_close_f32(adv.discounted_returns(r, m, gamma=0.7), ref * m, ulps=64)   # scan vs loop


@pytest.mark.parametrize("shift_mean", [True, False])
def test_whiten_matches_seed_formula(shift_mean):
  x = RNG.normal(2.0, 3.0, size=(B, T)).astype(np.float32)
  m = _masks()
  out = adv.whiten(x, m, shift_mean=shift_mean)
  assert_close_f32(out, np_whiten(x, m, shift_mean), ulps=64)   # masked mean/var vs NumPy's
  vals = np.asarray(out)[m > 0]
  assert abs(vals.std() - 1.0) < 1e-4
  if not shift_mean:  # unit variance, original mean kept (`whitened += mean`, arXiv:1909.08593)
    np.testing.assert_allclose(vals.mean(), x[m > 0].mean(), rtol=1e-4)


def test_whiten_empty_mask_no_nan():
  out = adv.whiten(jnp.ones((2, 3)), jnp.zeros((2, 3)), shift_mean=False)
  assert np.all(np.asarray(out) == 0)


# ---------- group estimators ----------


def test_group_advantages_seed_003_example():
  # r = (+1, +1, −1), mean 1/3 → Dr.GRPO A = r − mean = (2/3, 2/3, −4/3) (arXiv:2503.20783 §3.2).
  s = jnp.array([[1.0, 1.0, -1.0]])
  np.testing.assert_allclose(adv.group_advantages(s, scale_by_std=False),
                             [[2 / 3, 2 / 3, -4 / 3]], atol=1e-6)
  std = np.std([1, 1, -1], ddof=1)  # sqrt(4/3)
  np.testing.assert_allclose(adv.group_advantages(s, eps=0.0),
                             [[2 / 3 / std, 2 / 3 / std, -4 / 3 / std]], atol=1e-6)


def test_group_advantages_numpy_reference_and_dr_grpo_relation():
  s = RNG.normal(size=(B, G)).astype(np.float32)
  ref = (s - s.mean(-1, keepdims=True)) / (s.std(-1, ddof=1, keepdims=True) + 1e-6)
  assert_close_f32(adv.group_advantages(s), ref, ulps=64)   # mean/std: other summation order
  assert_close_f32(adv.group_advantages(s, scale_by_std=False), s - s.mean(-1, keepdims=True),
                   ulps=16)


def test_group_advantages_degenerate_groups():
  # all equal → 0; a singleton group (verl) → mean 0, std 1 → r/(1+ε); empty → 0.
  out = adv.group_advantages(jnp.array([[1.0, 1.0, 1.0], [3.0, 7.0, 9.0], [2.0, 2.0, 2.0]]),
                             mask_bg=jnp.array([[1, 1, 1], [0, 1, 0], [0, 0, 0]]))
  np.testing.assert_allclose(out, [[0, 0, 0], [0, 7.0 / (1 + 1e-6), 0], [0, 0, 0]], atol=1e-6)
  np.testing.assert_allclose(adv.group_advantages(jnp.array([[4.0]]), scale_by_std=False),
                             [[4.0]])


def test_group_advantages_mask_equals_dropping_samples():
  s = RNG.normal(size=(1, G)).astype(np.float32)
  mask = np.array([[1, 0, 1, 1, 0]])
  out = adv.group_advantages(s, mask_bg=mask)
  kept = adv.group_advantages(s[:, mask[0] > 0])
  # masked sums vs sums over the kept samples: other orders
  assert_close_f32(np.asarray(out)[mask > 0], np.asarray(kept)[0], ulps=16)


def test_batch_std_advantages():
  s = RNG.normal(size=(B, G)).astype(np.float32)
  ref = (s - s.mean(-1, keepdims=True)) / (s.std(ddof=1) + 1e-6)
  assert_close_f32(adv.batch_std_advantages(s), ref, ulps=64)   # batch std vs NumPy's


def test_rloo_leave_one_out_and_verl_form():
  s = RNG.normal(size=(B, G)).astype(np.float32)
  loo = np.stack([s[:, i] - np.delete(s, i, axis=1).mean(1) for i in range(G)], axis=1)
  mean = s.mean(-1, keepdims=True)
  verl = s * G / (G - 1) - mean * G / (G - 1)
  out = adv.rloo_advantages(s)
  assert_close_f32(out, loo, ulps=64)   # three formulas of one value: other roundings
  assert_close_f32(out, verl, ulps=64)
  np.testing.assert_allclose(adv.rloo_advantages(jnp.array([[5.0]])), [[0.0]])


def test_reinforce_pp_baseline():
  s = RNG.normal(size=(2, 3)).astype(np.float32)
  m = (RNG.random((2, 3, 4)) > 0.3).astype(np.float32)
  centred = np.broadcast_to((s - s.mean(-1, keepdims=True))[..., None], m.shape)
  assert_close_f32(adv.reinforce_pp_baseline_advantages(s, m), np_whiten(centred, m),
                   ulps=64)   # group mean, then batch whitening, vs NumPy's


def test_remax():
  np.testing.assert_allclose(adv.remax_advantages(jnp.array([1.0, 0.0, 0.5]),
                                                  jnp.array([0.0, 0.0, 1.0])), [1.0, 0.0, -0.5])


# ---------- pass@k advantage ----------


def np_pass_at_k_adv_bruteforce(correct, k):
  """Mean, over the size-k subsets containing a response, of (max − mean)/std (ddof 0)."""
  n = len(correct)
  subsets = list(itertools.combinations(range(n), k))
  rewards = np.array([max(correct[i] for i in sub) for sub in subsets], np.float64)
  mu, sigma = rewards.mean(), rewards.std()
  if sigma == 0:
    return np.zeros(n)
  norm = (rewards - mu) / sigma
  return np.array([np.mean([norm[j] for j, sub in enumerate(subsets) if i in sub])
                   for i in range(n)])


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_pass_at_k_advantages_match_subset_enumeration(k):
  groups = np.array([[1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0],
                     [0, 0, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1], [1, 0, 1, 0, 1, 0]], np.float32)
  out = adv.pass_at_k_advantages(groups, k=k)
  ref = np.stack([np_pass_at_k_adv_bruteforce(list(g), k) for g in groups])
  assert_close_f32(out, ref, ulps=64)   # closed form vs a float64 mean over subsets


def test_pass_at_1_advantage_is_grpo_with_biased_std():
  s = np.array([[1, 0, 0, 1, 1], [0, 1, 0, 0, 0]], np.float32)
  ref = (s - s.mean(-1, keepdims=True)) / s.std(-1, keepdims=True)
  assert_close_f32(adv.pass_at_k_advantages(s, k=1), ref, ulps=64)   # vs NumPy mean/std


def test_pass_at_k_advantages_threshold_and_mask():
  # {−1, +1} rewards with the default threshold 0.5; masked samples do not count.
  s = jnp.array([[1.0, -1.0, -1.0, 7.0]])
  out = adv.pass_at_k_advantages(s, k=2, mask_bg=jnp.array([[1, 1, 1, 0]]))
  ref = np_pass_at_k_adv_bruteforce([1, 0, 0], 2)
  assert_close_f32(np.asarray(out)[0, :3], ref, ulps=64)   # closed form vs subset mean
  assert float(out[0, 3]) == 0.0


# ---------- property: masked values never matter ----------

_GARBAGE = st.floats(allow_nan=True, allow_infinity=True, width=32)
_FINITE = st.floats(-10, 10, width=32)
_ops_bt = {
    "gae": jax.jit(lambda r, v, m: adv.gae(r, v, m, gamma=0.9, lam=0.8)),
    "rpp": jax.jit(lambda r, v, m: adv.reinforce_pp_advantages(r + v, m, gamma=0.9)),
    "whiten": jax.jit(lambda r, v, m: adv.whiten(r * v, m, shift_mean=False)),
}
_ops_bg = {
    "grpo": jax.jit(lambda s, m: adv.group_advantages(s, mask_bg=m)),
    "batch": jax.jit(lambda s, m: adv.batch_std_advantages(s, mask_bg=m)),
    "rloo": jax.jit(lambda s, m: adv.rloo_advantages(s, mask_bg=m)),
    "passk": jax.jit(lambda s, m: adv.pass_at_k_advantages(s, k=2, mask_bg=m)),
}


@given(r=hnp.arrays(np.float32, (3, 5), elements=_FINITE),
       v=hnp.arrays(np.float32, (3, 5), elements=_FINITE),
       m=hnp.arrays(np.bool_, (3, 5)),
       junk=hnp.arrays(np.float32, (3, 5), elements=_GARBAGE))
def test_masked_positions_never_change_outputs(r, v, m, junk):
  for fn in _ops_bt.values():
    clean = fn(r, v, m)
    dirty = fn(np.where(m, r, junk), np.where(m, v, junk[::-1]), m)
    for a, b in zip(jax.tree.leaves(clean), jax.tree.leaves(dirty)):
      np.testing.assert_array_equal(a, b)
      assert np.all(np.isfinite(a))
  s, sm = r[:, :4], m[:, :4]
  for fn in _ops_bg.values():
    clean = fn(s, sm)
    dirty = fn(np.where(sm, s, junk[:, :4]), sm)
    np.testing.assert_array_equal(clean, dirty)
    assert np.all(np.isfinite(clean))
