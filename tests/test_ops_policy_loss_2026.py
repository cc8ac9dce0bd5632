"""The 2026 policy losses (rljax.ops.policy_loss_gated, policy_loss_sequence) against NumPy
references of their papers' equations, gradient tests (SAPO's gate, GMPO's clip, DPPO's mask)
and relations to their older siblings (token PPO, GSPO, REINFORCE)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tolerances import assert_close_f32

from rljax.ops import policy_loss_gated as gated
from rljax.ops import policy_loss_sequence as sequence
from rljax.ops.aggregate import aggregate
from rljax.ops.policy_loss import POLICY_LOSSES, get_policy_loss, policy_loss, reinforce_loss

MASK = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [0, 0, 0, 0, 0]], np.float32)


def _inputs(seed, shape=MASK.shape, spread=0.4):
  rng = np.random.default_rng(seed)
  logp = rng.uniform(-3.0, -0.1, shape).astype(np.float32)
  old_logp = (logp - rng.normal(0.0, spread, shape)).astype(np.float32)
  adv = rng.normal(0.0, 1.0, shape).astype(np.float32)
  return logp, old_logp, adv


def _grad(fn, logp, old_logp, adv, mask=MASK, mode=None, **kw):
  """∇_logp of Σ loss_bt (or of `aggregate(loss, mask, mode)`)."""
  def total(lp):
    loss = fn(lp, old_logp, adv, mask, **kw)[0]
    return jnp.sum(loss) if mode is None else aggregate(loss, mask, mode)
  return np.asarray(jax.grad(total)(jnp.asarray(logp)))


def test_every_new_loss_is_registered_by_its_peer_name():
  for name in ("sapo", "geo_mean", "gpg", "dppo_tv", "dppo_kl", "dro", "luspo", "vespo"):
    assert get_policy_loss(name) is POLICY_LOSSES[name].fn
  with pytest.raises(ValueError, match="sapo"):
    get_policy_loss("sapoo")


# ---------------------------------------------------------------- SAPO


def np_sapo(logp, old_logp, adv, mask, tau_pos, tau_neg):
  """SAPO (arXiv:2511.20347): −(4/τ)σ(τ(r − 1))·A, τ by the sign of A."""
  r = np.exp(logp - old_logp)
  tau = np.where(adv > 0, tau_pos, tau_neg)
  gate = 4.0 / tau / (1.0 + np.exp(-tau * (r - 1.0)))
  return -gate * adv * mask


def test_sapo_matches_numpy_reference():
  logp, old, adv = _inputs(0)
  got, _ = gated.sapo_loss(logp, old, adv, MASK, tau_pos=1.0, tau_neg=1.05)
  np.testing.assert_allclose(got, np_sapo(logp, old, adv, MASK, 1.0, 1.05), rtol=1e-5, atol=1e-6)


def test_sapo_gate_gradient_is_4_sigma_1_minus_sigma_times_r():
  """∂L/∂logπ = −A·r·4σ(1 − σ): 1·(−A) on-policy, smaller as r leaves 1."""
  logp, old, adv = _inputs(1)
  tau = np.where(adv > 0, 1.0, 1.05)
  r = np.exp(logp - old)
  sig = 1.0 / (1.0 + np.exp(-tau * (r - 1.0)))
  want = -adv * r * 4.0 * sig * (1.0 - sig) * MASK
  np.testing.assert_allclose(_grad(gated.sapo_loss, logp, old, adv), want, rtol=1e-4, atol=1e-6)
  on_policy = _grad(gated.sapo_loss, logp, logp, adv)
  np.testing.assert_allclose(on_policy, -adv * MASK, rtol=1e-5, atol=1e-6)   # = PPO's gradient


def test_sapo_tends_to_the_hard_clip_limit_and_to_the_unclipped_surrogate():
  """τ → ∞: the gradient vanishes wherever PPO with ε → 0 has clipped (and at every r ≠ 1);
  τ → 0: the gradient of the unclipped surrogate −r·A."""
  logp, old, adv = _inputs(2)
  big = _grad(gated.sapo_loss, logp, old, adv, tau_pos=1e4, tau_neg=1e4)
  ppo = _grad(policy_loss, logp, old, adv, eps_low=1e-3, eps_high=1e-3)
  r = np.exp(logp - old)
  off = (MASK > 0) & (np.abs(r - 1.0) > 0.01)
  assert off.sum() >= 5
  np.testing.assert_allclose(big[off], 0.0, atol=1e-6)
  assert (ppo[off] == 0).any()   # PPO with ε → 0 clipped some of them: both give 0 there
  small = _grad(gated.sapo_loss, logp, old, adv, tau_pos=1e-3, tau_neg=1e-3)
  np.testing.assert_allclose(small, -adv * r * MASK, rtol=1e-3, atol=1e-5)


def test_sapo_rejects_nonpositive_temperature():
  logp, old, adv = _inputs(3)
  with pytest.raises(ValueError, match="tau_neg"):
    gated.sapo_loss(logp, old, adv, MASK, tau_neg=0.0)


# ---------------------------------------------------------------- GMPO


def np_gmpo(logp, old, adv_b, mask, eps_low, eps_high):
  """GMPO (arXiv:2507.20673): −A_i·exp(mean_t sgn·min(sgn·ℓ, sgn·clip(ℓ))) per sequence."""
  out = np.zeros(mask.shape[0])
  for i in range(mask.shape[0]):
    idx = mask[i] > 0
    if not idx.any():
      continue
    ell = logp[i, idx] - old[i, idx]
    s = np.sign(adv_b[i])
    hat = s * np.minimum(s * ell, s * np.clip(ell, -eps_low, eps_high))
    out[i] = -adv_b[i] * np.exp(hat.mean())
  return out


def test_gmpo_matches_numpy_reference_per_sequence():
  logp, old, _ = _inputs(4)
  adv_b = np.array([1.3, -0.7, 0.4, 2.0], np.float32)
  got, diag = sequence.gmpo_loss(logp, old, adv_b, MASK, eps_low=0.2, eps_high=0.3)
  want = np_gmpo(logp, old, adv_b, MASK, 0.2, 0.3)
  for i in range(3):
    np.testing.assert_allclose(np.asarray(got)[i, MASK[i] > 0], want[i], rtol=1e-5)
  assert np.all(np.asarray(got)[MASK == 0] == 0)
  # seq_mean_token_mean = the paper's (1/G) Σ_i L_i over non-empty sequences
  # a mean of signed per-sequence losses: the bound scales with the terms, not the mean
  assert_close_f32(aggregate(got, MASK, "seq_mean_token_mean"), want[:3].mean(), ulps=16,
                   scale=np.abs(want[:3]).max())
  assert float(diag.ratio_max) > 0


def test_gmpo_on_length_one_sequences_is_token_ppo_with_exponential_bounds():
  rng = np.random.default_rng(5)
  mask = np.ones((16, 1), np.float32)
  logp = rng.uniform(-2, -0.1, (16, 1)).astype(np.float32)
  old = (logp - rng.normal(0, 0.5, (16, 1))).astype(np.float32)
  adv_b = rng.normal(size=16).astype(np.float32)
  got, _ = sequence.gmpo_loss(logp, old, adv_b, mask, eps_low=0.2, eps_high=0.3)
  ppo, _ = policy_loss(logp, old, adv_b, mask, eps_low=1 - math.exp(-0.2),
                       eps_high=math.exp(0.3) - 1)
  np.testing.assert_allclose(got, ppo, rtol=1e-5, atol=1e-6)
  g1 = _grad(sequence.gmpo_loss, logp, old, adv_b, mask=mask, eps_low=0.2, eps_high=0.3)
  g2 = _grad(policy_loss, logp, old, adv_b, mask=mask, eps_low=1 - math.exp(-0.2),
             eps_high=math.exp(0.3) - 1)
  np.testing.assert_allclose(g1, g2, rtol=1e-4, atol=1e-6)


def test_gmpo_clip_stops_only_the_clipped_tokens_gradient():
  """A > 0: a token with ℓ > ε_high gets 0; the others get −A·ρ/|y| each."""
  logp = np.log(np.array([[0.5, 0.5, 0.5, 0.5]], np.float32))
  old = logp - np.array([[0.0, 0.1, 0.5, -0.1]], np.float32)      # ℓ = (0, .1, .5, −.1)
  mask = np.ones_like(logp)
  adv = np.array([2.0], np.float32)
  g = _grad(sequence.gmpo_loss, logp, old, adv, mask=mask, eps_low=0.2, eps_high=0.2,
            mode="seq_mean_token_mean")
  rho = math.exp((0.0 + 0.1 + 0.2 - 0.1) / 4)
  np.testing.assert_allclose(g, [[-2 * rho / 4, -2 * rho / 4, 0.0, -2 * rho / 4]], rtol=1e-5)
  # A < 0: the clip binds on the low side instead; the ℓ = 0.5 token keeps its gradient
  g_neg = _grad(sequence.gmpo_loss, logp, old, -adv, mask=mask, eps_low=0.05, eps_high=0.2,
                mode="seq_mean_token_mean")
  assert g_neg[0, 2] > 0 and g_neg[0, 3] == 0.0


# ---------------------------------------------------------------- GPG, DRO, VESPO, LUSPO


def test_gpg_is_reinforce_and_its_gradient_is_minus_advantage():
  logp, old, adv = _inputs(6)
  got, _ = gated.gpg_loss(logp, old, adv, MASK)
  np.testing.assert_allclose(got, -adv * logp * MASK, rtol=1e-6)
  np.testing.assert_allclose(got, reinforce_loss(logp, old, adv, MASK)[0], rtol=1e-6)
  np.testing.assert_allclose(_grad(gated.gpg_loss, logp, old, adv), -adv * MASK, rtol=1e-6)


def test_dro_matches_reference_and_gradient_pulls_back_to_old_policy():
  logp, old, adv = _inputs(7)
  got, _ = gated.dro_loss(logp, old, adv, MASK, beta=0.3)
  np.testing.assert_allclose(got, (-adv * logp + 0.15 * (logp - old) ** 2) * MASK, rtol=1e-5,
                             atol=1e-6)
  g = _grad(gated.dro_loss, logp, old, adv, beta=0.3)
  np.testing.assert_allclose(g, (-adv + 0.3 * (logp - old)) * MASK, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(_grad(gated.dro_loss, old, old, adv, beta=0.3),
                             _grad(gated.gpg_loss, old, old, adv), rtol=1e-6)   # ℓ = 0


def np_vespo_phi(logp, old, adv_b, mask, kp=2.0, lp=3.0, kn=3.0, ln=2.0):
  """VESPO (arXiv:2602.10693): φ(w) = e^λ w^k e^{−λw}, w = Π_t r_t, (k, λ) by sign A."""
  w = np.exp(np.sum((logp - old) * mask, axis=1))
  k = np.where(adv_b >= 0, kp, kn)
  lam = np.where(adv_b >= 0, lp, ln)
  return np.exp(lam) * w ** k * np.exp(-lam * w)


def test_vespo_weights_and_loss_match_reference():
  logp, old, _ = _inputs(8, spread=0.15)
  adv_b = np.array([1.0, -0.5, 0.3, 0.0], np.float32)
  phi = sequence.vespo_weights(logp, old, adv_b, MASK)
  want = np_vespo_phi(logp, old, adv_b, MASK)
  np.testing.assert_allclose(phi, want, rtol=1e-4)
  np.testing.assert_allclose(sequence.vespo_weights(logp, logp, adv_b, MASK), 1.0, rtol=1e-6)
  loss, _ = sequence.vespo_loss(logp, old, adv_b, MASK)
  np.testing.assert_allclose(loss, -want[:, None] * adv_b[:, None] * logp * MASK, rtol=1e-4,
                             atol=1e-6)
  # φ is a stop-gradient weight: ∇ = −φ·A
  np.testing.assert_allclose(_grad(sequence.vespo_loss, logp, old, adv_b),
                             -want[:, None] * adv_b[:, None] * MASK, rtol=1e-4, atol=1e-6)


def test_luspo_is_gspo_weighted_by_length():
  logp, old, _ = _inputs(9, spread=0.1)
  adv_b = np.array([1.0, -2.0, 0.5, 1.0], np.float32)
  got, _ = sequence.luspo_loss(logp, old, adv_b, MASK, eps_low=0.05, eps_high=0.05)
  gspo, _ = policy_loss(logp, old, adv_b, MASK, ratio_level="sequence", eps_low=0.05,
                        eps_high=0.05)
  np.testing.assert_allclose(got, gspo, rtol=1e-6)
  terms = []
  for i in range(4):
    idx = MASK[i] > 0
    if idx.any():
      s = np.exp(np.mean(logp[i, idx] - old[i, idx]))
      surrogate = min(s * adv_b[i], np.clip(s, 0.95, 1.05) * adv_b[i])
      terms.append(-idx.sum() * surrogate)   # the empty row 3 does not count (aggregate)
  # a mean of signed per-sequence sums: the bound scales with the terms, not the mean
  assert_close_f32(aggregate(got, MASK, "seq_mean_token_sum"), np.mean(terms), ulps=16,
                   scale=np.abs(terms).max())


# ---------------------------------------------------------------- DPPO


def test_dppo_tv_mask_keeps_rare_tokens_and_stops_large_probability_moves():
  """Rare token 1e-5 → 1e-3 (ratio 100, PPO clips it) stays; 0.9 → 0.6 with A < 0 leaves."""
  p = np.array([[1e-3, 0.6, 0.5, 0.3]], np.float32)
  p_old = np.array([[1e-5, 0.9, 0.45, 0.6]], np.float32)
  adv = np.array([[1.0, -1.0, 1.0, -1.0]], np.float32)
  mask = np.ones_like(p)
  logp, old = np.log(p), np.log(p_old)
  loss, diag = gated.dppo_loss(logp, old, adv, mask, divergence="tv", delta_low=0.15,
                               delta_high=0.15, ratio_cap=20.0)
  r = p / p_old
  valid = np.array([[1, 0, 1, 0]], np.float32)   # |Δp| = 1e-3, −0.3, 0.05, −0.3
  np.testing.assert_allclose(loss, -adv * np.minimum(r, 20.0) * logp * valid, rtol=1e-5)
  np.testing.assert_array_equal(np.asarray(diag.clip_low_bt), [[0, 1, 0, 1]])
  np.testing.assert_array_equal(np.asarray(diag.ratio_cap_bt), [[1, 0, 0, 0]])
  g = _grad(gated.dppo_loss, logp, old, adv, mask=mask, divergence="tv")
  # default C = 3.0: verl's `clip_ratio_c` as ActorConfig / actor.yaml set it
  np.testing.assert_allclose(g, -adv * np.minimum(r, 3.0) * valid, rtol=1e-5)
  assert np.asarray(g)[0, 0] == pytest.approx(-3.0, rel=1e-5)   # ratio 100 truncated at 3


def np_binary_kl(a, b):
  return a * np.log(a / b) + (1 - a) * np.log((1 - a) / (1 - b))


def test_dppo_kl_uses_the_binary_kl_region_one_sided_by_advantage():
  rng = np.random.default_rng(10)
  p_old = rng.uniform(0.01, 0.95, (6, 5)).astype(np.float32)
  p = np.clip(p_old + rng.normal(0, 0.2, p_old.shape), 0.005, 0.99).astype(np.float32)
  adv = rng.normal(size=p.shape).astype(np.float32)
  mask = np.ones_like(p)
  loss, _ = gated.dppo_loss(np.log(p), np.log(p_old), adv, mask, divergence="kl",
                            delta_low=0.05, delta_high=0.05)
  d = np_binary_kl(p_old.astype(np.float64), p.astype(np.float64))
  valid = np.where(adv > 0, (d <= 0.05) | (p <= p_old), (d <= 0.05) | (p >= p_old))
  assert 0 < valid.sum() < valid.size
  want = -adv * np.minimum(p / p_old, 3.0) * np.log(p) * valid   # default C = 3.0 (verl)
  assert np.any((p / p_old > 3.0) & valid)   # the default truncation is exercised
  np.testing.assert_allclose(loss, want, rtol=1e-4, atol=1e-6)
  # on-policy both divergences keep every token and equal GPG
  tv, _ = gated.dppo_loss(np.log(p), np.log(p), adv, mask, divergence="tv")
  np.testing.assert_allclose(tv, gated.gpg_loss(np.log(p), np.log(p), adv, mask)[0], rtol=1e-6)
  with pytest.raises(ValueError, match="divergence"):
    gated.dppo_loss(np.log(p), np.log(p), adv, mask, divergence="js")


@pytest.mark.parametrize("name", ["sapo", "geo_mean", "gpg", "dppo_tv", "dppo_kl", "dro",
                                  "luspo", "vespo"])
def test_masked_positions_never_matter(name):
  """Garbage (±1e4) at masked positions changes neither the loss nor its gradient."""
  logp, old, adv = _inputs(11)
  fn = POLICY_LOSSES[name]
  junk = np.where(MASK > 0, 0.0, 1e4).astype(np.float32)
  a, _ = fn(logp, old, adv, MASK)
  b, _ = fn(logp - junk, old + junk, adv + junk, MASK)
  np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
  ga = _grad(fn, logp, old, adv)
  gb = _grad(fn, logp - junk, old + junk, adv + junk)
  np.testing.assert_allclose(ga, gb, rtol=1e-6, atol=1e-6)
  assert np.all(ga[MASK == 0] == 0)
