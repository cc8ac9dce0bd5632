"""Policy losses against NumPy references of their papers' equations, two worked examples
(GSPO vs GRPO on two tokens, length dilution), gradient tests (what each clip does to the
gradient) and relations."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.ops.aggregate import aggregate
from rljax.ops.policy_loss import (
    POLICY_LOSSES,
    cispo_loss,
    clip_cov_loss,
    clip_cov_mask,
    get_policy_loss,
    kl_cov_loss,
    policy_loss,
    reinforce_loss,
)

MASK = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [0, 0, 0, 0, 0]], np.float32)


def _inputs(seed, shape=MASK.shape, spread=0.4):
  rng = np.random.default_rng(seed)
  logp = rng.uniform(-3.0, -0.1, shape).astype(np.float32)
  old_logp = (logp - rng.normal(0.0, spread, shape)).astype(np.float32)
  adv = rng.normal(0.0, 1.0, shape).astype(np.float32)
  return logp, old_logp, adv


def np_ppo(logp, old_logp, adv, mask, eps_low, eps_high, c=None, delta=None):
  """PPO clip (arXiv:1707.06347 Eq. 7), DAPO decoupled ε (Eq. 10), verl's dual clip, and
  TRL's two-sided clip: per_token_loss = −min(min(ρ, δ)·A, clamp(ρ, 1 − ε_low, 1 + ε_high)·A)
  (GRPOTrainer `delta`: coef_2 is clamped from the raw ratio, then coef_1 is capped)."""
  r = np.exp(np.clip(logp - old_logp, -20, 20))
  coef_2 = np.clip(r, 1 - eps_low, 1 + eps_high)
  coef_1 = r if delta is None else np.minimum(r, delta)
  loss = -np.minimum(coef_1 * adv, coef_2 * adv)
  if c is not None:
    loss = np.where(adv < 0, np.minimum(loss, -adv * c), loss)
  return loss * mask


def np_ppo_cap_first(logp, old_logp, adv, mask, eps_low, eps_high, delta):
  """The order rljax used before: ρ ← min(ρ, δ), then the PPO clip on the capped ρ."""
  r = np.minimum(np.exp(np.clip(logp - old_logp, -20, 20)), delta)
  return np.maximum(-adv * r, -adv * np.clip(r, 1 - eps_low, 1 + eps_high)) * mask


def np_gspo_objective(logp, old_logp, adv_b, mask, eps_low, eps_high):
  """GSPO Eq. 5 with s_i of Eq. 7: (1/G) Σ_i min(s_i A_i, clip(s_i) A_i), nonempty rows."""
  terms = []
  for i in range(mask.shape[0]):
    idx = mask[i] > 0
    if idx.any():
      s = np.exp(np.mean(logp[i, idx] - old_logp[i, idx]))
      terms.append(min(s * adv_b[i], np.clip(s, 1 - eps_low, 1 + eps_high) * adv_b[i]))
  return float(np.mean(terms))


def _grad_logp(fn, logp, *args, mode="sum", mask=MASK, **kw):
  """∇_logp of the aggregated loss ("sum": plain Σ over the batch)."""
  def total(lp):
    loss = fn(lp, *args, mask, **kw)[0]
    if mode == "sum":
      return jnp.sum(loss)
    return aggregate(loss, mask, mode, max_len=mask.shape[1])
  return np.asarray(jax.grad(total)(jnp.asarray(logp)))


# ---------------------------------------------------------------- references


@pytest.mark.parametrize("adv_rank", [1, 2])
@pytest.mark.parametrize("hyper", [
    dict(eps_low=0.2, eps_high=0.2),
    dict(eps_low=0.2, eps_high=0.28, dual_clip=3.0),
    dict(eps_low=0.1, eps_high=0.3, ratio_cap=1.5),
])
def test_token_ppo_matches_numpy(adv_rank, hyper):
  logp, old_logp, adv = _inputs(0, spread=0.8)
  adv_in = adv[:, 0] if adv_rank == 1 else adv
  adv_bt = np.broadcast_to(adv_in[:, None], MASK.shape) if adv_rank == 1 else adv
  loss, diag = policy_loss(logp, old_logp, adv_in, MASK, **hyper)
  ref = np_ppo(logp, old_logp, adv_bt, MASK, hyper["eps_low"], hyper["eps_high"],
               hyper.get("dual_clip"), hyper.get("ratio_cap"))
  np.testing.assert_allclose(loss, ref, rtol=1e-5, atol=1e-6)
  r = np.exp(logp - old_logp)
  np.testing.assert_allclose(diag.ratio_bt, r * MASK, rtol=1e-5)   # the raw ratio
  np.testing.assert_allclose(diag.approx_kl_bt, (r - 1 - np.log(r)) * MASK, rtol=1e-4, atol=1e-6)
  high, low = 1 + hyper["eps_high"], 1 - hyper["eps_low"]
  np.testing.assert_array_equal(diag.clip_high_bt, ((adv_bt > 0) & (r > high)) * MASK)
  np.testing.assert_array_equal(diag.clip_low_bt, ((adv_bt < 0) & (r < low)) * MASK)
  if "dual_clip" in hyper:
    np.testing.assert_array_equal(diag.clip_dual_bt, ((adv_bt < 0) & (r > 3.0)) * MASK)
  if "ratio_cap" in hyper:   # δ = 1.5 ≥ 1 + ε_high: the cap binds on A < 0 tokens only
    np.testing.assert_array_equal(diag.ratio_cap_bt, ((adv_bt < 0) & (r > 1.5)) * MASK)
  np.testing.assert_allclose(diag.ratio_max, r[MASK > 0].max(), rtol=1e-6)
  np.testing.assert_allclose(diag.ratio_min, r[MASK > 0].min(), rtol=1e-6)


def test_gspo_matches_numpy_objective():
  logp, old_logp, adv = _inputs(1, spread=0.3)
  adv_b = adv[:, 0]
  for eps in (0.05, 0.2, 1.0):
    loss, _ = policy_loss(logp, old_logp, adv_b, MASK, ratio_level="sequence",
                          eps_low=eps, eps_high=eps)
    got = aggregate(loss, MASK, "seq_mean_token_mean")
    np.testing.assert_allclose(-got, np_gspo_objective(logp, old_logp, adv_b, MASK, eps, eps),
                               rtol=1e-5)


def test_seed003_two_token_gspo_vs_grpo_example():
  # A = 1, ε = 0.2, token ratios ρ1 = 2.0, ρ2 = 0.4 (GSPO, arXiv:2507.18071, Eqs. 5 and 7).
  # From the equation, token 2 contributes min(ρ2·A, clip(ρ2)·A) = min(0.4, 0.8) = 0.4, so
  # GRPO's objective is (1.2 + 0.4)/2 = 0.8 (not 1.0, which reading min(0.4, 0.8) as 0.8
  # would give).
  logp = jnp.log(jnp.array([[2.0, 0.4]]))
  old_logp, mask, adv = jnp.zeros((1, 2)), jnp.ones((1, 2)), jnp.ones((1,))
  grpo, _ = policy_loss(logp, old_logp, adv, mask)
  np.testing.assert_allclose(-grpo, [[1.2, 0.4]], rtol=1e-6)
  np.testing.assert_allclose(-aggregate(grpo, mask, "seq_mean_token_mean"), 0.8, rtol=1e-6)
  gspo, diag = policy_loss(logp, old_logp, adv, mask, ratio_level="sequence")
  np.testing.assert_allclose(-aggregate(gspo, mask, "seq_mean_token_mean"), np.sqrt(0.8), rtol=1e-6)
  np.testing.assert_allclose(diag.ratio_bt, [[0.894, 0.894]], atol=5e-4)  # √0.8 ≈ 0.894
  assert float(diag.clip_high_bt.sum() + diag.clip_low_bt.sum()) == 0.0  # 0.894 ∈ [0.8, 1.2]


def test_seed003_length_dilution_example():
  # Length dilution (Dr. GRPO, arXiv:2503.20783 §3.1): one prompt, completions A (2 tokens,
  # r=+1), B (6, +1), C (6, −1);
  # mean baseline 1/3 → advantages +2/3, +2/3, −4/3. On-policy (ratio 1).
  scores = np.array([1.0, 1.0, -1.0])
  adv = (scores - scores.mean()).astype(np.float32)
  np.testing.assert_allclose(adv, [2 / 3, 2 / 3, -4 / 3], rtol=1e-6)
  lengths = np.array([2, 6, 6])
  mask = (np.arange(6)[None] < lengths[:, None]).astype(np.float32)
  logp = np.full((3, 6), -1.0, np.float32)
  # GRPO (seq_mean_token_mean): each token's weight is A_i/|y_i| (per-token shares
  # +2/3/2, +2/3/6, −4/3/6), times 1/K. Gradient of the loss = −weight.
  grad = _grad_logp(policy_loss, logp, logp, adv, mode="seq_mean_token_mean", mask=mask)
  expected = -(adv / lengths / 3)[:, None] * mask
  np.testing.assert_allclose(grad, expected, rtol=1e-6)
  np.testing.assert_allclose(grad[:, 0], [-1 / 9, -1 / 27, 2 / 27], rtol=1e-6)
  # Each sample's *total* weight is A_i/K, whatever its length, for GRPO and for GSPO.
  gspo_grad = _grad_logp(policy_loss, logp, logp, adv, mode="seq_mean_token_mean", mask=mask,
                         ratio_level="sequence")
  np.testing.assert_allclose(gspo_grad.sum(-1), -adv / 3, rtol=1e-6)
  np.testing.assert_allclose(gspo_grad, expected, rtol=1e-6)
  # DAPO token_mean removes the dilution: every token weighs A_i/Σ|y| (A and B tokens equal).
  tm = _grad_logp(policy_loss, logp, logp, adv, mode="token_mean", mask=mask)
  np.testing.assert_allclose(tm, -(adv / 14)[:, None] * mask, rtol=1e-6)
  # Dr.GRPO: constant normaliser max_len (= 6 here), then mean over sequences.
  dr = _grad_logp(policy_loss, logp, logp, adv, mode="seq_mean_token_sum_norm", mask=mask)
  np.testing.assert_allclose(dr, -(adv / 6 / 3)[:, None] * mask, rtol=1e-6)


# ---------------------------------------------------------------- gradients


def _single_token_grad(fn, log_r, adv, **kw):
  logp = jnp.array([[log_r]], jnp.float32)
  zero, mask = jnp.zeros((1, 1)), jnp.ones((1, 1))
  value_and_grad = jax.value_and_grad(lambda lp: fn(lp, zero, jnp.array([adv]), mask, **kw)[0][0, 0])
  value, grad = value_and_grad(logp)
  return float(value), float(grad[0, 0])


def test_clip_higher_lets_ratio_rise_to_one_plus_eps_high_and_no_further():
  kw = dict(eps_low=0.2, eps_high=0.28)
  for r in (1.1, 1.2, 1.25, 1.27):
    value, grad = _single_token_grad(policy_loss, np.log(r), 1.0, **kw)
    np.testing.assert_allclose([value, grad], [-r, -r], rtol=1e-5)  # −A·r, ∂/∂logp = −A·r
  for r in (1.29, 1.5, 3.0):
    value, grad = _single_token_grad(policy_loss, np.log(r), 1.0, **kw)
    np.testing.assert_allclose(value, -1.28, rtol=1e-6)
    assert grad == 0.0
  # with symmetric ε = 0.2 the same token stops at 1.2
  assert _single_token_grad(policy_loss, np.log(1.25), 1.0)[1] == 0.0


def test_dual_clip_bounds_negative_advantage_loss_at_c_abs_a():
  adv, c = -2.0, 3.0
  for r in (2.0, 2.9):
    value, grad = _single_token_grad(policy_loss, np.log(r), adv, dual_clip=c)
    np.testing.assert_allclose([value, grad], [2.0 * r, 2.0 * r], rtol=1e-5)
  for r in (3.1, 10.0, 1e4):
    value, grad = _single_token_grad(policy_loss, np.log(r), adv, dual_clip=c)
    np.testing.assert_allclose(value, c * abs(adv), rtol=1e-6)
    assert grad == 0.0
    assert _single_token_grad(policy_loss, np.log(r), adv)[0] == pytest.approx(2.0 * r, rel=1e-5)
  # positive advantages are untouched by the dual clip
  assert _single_token_grad(policy_loss, np.log(10.0), 1.0, dual_clip=c)[0] == pytest.approx(-1.2)


def test_ratio_cap_bounds_the_negative_advantage_loss_at_delta_abs_a():
  value, grad = _single_token_grad(policy_loss, np.log(10.0), -1.0, ratio_cap=4.0)
  assert value == pytest.approx(4.0) and grad == 0.0
  value, grad = _single_token_grad(policy_loss, np.log(3.0), -1.0, ratio_cap=4.0)
  np.testing.assert_allclose([value, grad], [3.0, 3.0], rtol=1e-5)


def test_ratio_cap_below_one_plus_eps_high_golden():
  # δ = 1.2 < 1 + ε_high = 1.28, ε_low = 0.2. By hand from −min(min(ρ, δ)A, clip(ρ)A):
  kw = dict(eps_low=0.2, eps_high=0.28, ratio_cap=1.2)
  cases = [  # (ρ, A, loss, ∂loss/∂logπ)
      (1.25, -1.0, 1.25, 1.25),   # max(min(1.25, 1.2), 1.25) = 1.25: keeps its gradient
      (2.00, -1.0, 1.28, 0.0),    # max(1.2, clip 1.28) = 1.28: flat at (1 + ε_high)·|A|
      (1.25, +1.0, -1.2, 0.0),    # min(1.2, 1.25) = 1.2: δ is the ceiling for A > 0
      (1.10, +1.0, -1.1, -1.1),
      (0.50, -1.0, 0.8, 0.0),     # the lower clip as usual
  ]
  for r, adv, want_value, want_grad in cases:
    value, grad = _single_token_grad(policy_loss, np.log(r), adv, **kw)
    np.testing.assert_allclose([value, grad], [want_value, want_grad], rtol=1e-5, atol=1e-7)
  # capping ρ first (the old order) would give 1.2 and no gradient for the first token
  assert np_ppo_cap_first(np.log([[1.25]]), np.zeros((1, 1)), -np.ones((1, 1)), 1, 0.2, 0.28,
                          1.2)[0, 0] == pytest.approx(1.2)


def _trl_ragged_batch():
  """A ragged batch whose ratios fall on every side of 1 − ε_low, δ = 1.2 and 1 + ε_high."""
  mask = np.array([[1] * 8, [1] * 6 + [0] * 2, [1] * 3 + [0] * 5, [1] * 7 + [0]], np.float32)
  r = np.array([[0.5, 0.9, 1.1, 1.22, 1.25, 1.3, 2.0, 1.15],
                [1.27, 1.21, 0.7, 1.05, 3.0, 1.24, 9.0, 9.0],
                [1.26, 1.5, 0.85, 9.0, 9.0, 9.0, 9.0, 9.0],
                [0.6, 1.23, 1.19, 1.29, 1.4, 0.95, 1.26, 9.0]])
  rng = np.random.default_rng(7)
  old_logp = rng.uniform(-3.0, -0.2, mask.shape)
  logp = (old_logp + np.log(r)).astype(np.float32)
  adv = np.where(rng.uniform(size=mask.shape) < 0.5, -1.0, 1.0) * rng.uniform(0.3, 2.0, mask.shape)
  return logp, old_logp.astype(np.float32), adv.astype(np.float32), mask


def _np_token_grad(fn, logp, *args, h=1e-6):
  """∂(Σ loss)/∂logp by central differences of a NumPy reference (float64; token-local)."""
  lp = logp.astype(np.float64)
  return (fn(lp + h, *args) - fn(lp - h, *args)) / (2 * h)


def test_ratio_cap_follows_trl_loss_and_gradient_below_one_plus_eps_high():
  logp, old_logp, adv, mask = _trl_ragged_batch()
  kw = dict(eps_low=0.2, eps_high=0.28, ratio_cap=1.2)
  loss, diag = policy_loss(logp, old_logp, adv, mask, **kw)
  ref = np_ppo(logp, old_logp, adv, mask, 0.2, 0.28, delta=1.2)
  np.testing.assert_allclose(loss, ref, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(aggregate(loss, mask, "token_mean"), ref.sum() / mask.sum(),
                             rtol=1e-5)
  got_grad = _grad_logp(policy_loss, logp, old_logp, adv, mask=mask, **kw)
  want_grad = _np_token_grad(lambda lp: np_ppo(lp, old_logp, adv, mask, 0.2, 0.28, delta=1.2),
                             logp)
  np.testing.assert_allclose(got_grad, want_grad, rtol=1e-4, atol=1e-5)
  # the old order really differs here (loss and gradient), so the test can tell them apart
  old = np_ppo_cap_first(logp, old_logp, adv, mask, 0.2, 0.28, 1.2)
  assert np.abs(old - ref).max() > 1e-2
  old_grad = _np_token_grad(lambda lp: np_ppo_cap_first(lp, old_logp, adv, mask, 0.2, 0.28, 1.2),
                            logp)
  assert np.abs(old_grad - want_grad).max() > 1e-2
  # diagnostics: the active bound of each token
  r = np.exp(logp.astype(np.float64) - old_logp)
  np.testing.assert_allclose(diag.ratio_bt, r * mask, rtol=1e-5)
  want_cap = ((adv > 0) & (r > 1.2)) | ((adv < 0) & (r > 1.28))
  np.testing.assert_array_equal(diag.ratio_cap_bt, want_cap * mask)
  np.testing.assert_array_equal(diag.clip_high_bt, np.zeros_like(mask))   # δ is the ceiling
  np.testing.assert_array_equal(diag.clip_low_bt, ((adv < 0) & (r < 0.8)) * mask)
  # every flagged token is flat in ρ (no gradient), and the flags are exclusive
  flagged = (np.asarray(diag.ratio_cap_bt) + np.asarray(diag.clip_low_bt)) > 0
  assert flagged.sum() >= 6 and np.all(got_grad[flagged] == 0.0)
  assert np.all(np.asarray(diag.ratio_cap_bt) * np.asarray(diag.clip_low_bt) == 0)


def test_ratio_cap_follows_trl_at_sequence_level():
  logp, old_logp, adv, mask = _trl_ragged_batch()
  adv_b = adv[:, 0]
  loss, diag = policy_loss(logp, old_logp, adv_b, mask, ratio_level="sequence", eps_low=0.2,
                           eps_high=0.28, ratio_cap=1.15)
  # TRL importance_sampling_level="sequence": s = exp(Σ(log r · m)/Σm), one (B, 1) ratio
  # that goes through the same two-sided formula
  log_r = (logp.astype(np.float64) - old_logp) * mask
  s = np.exp(log_r.sum(1) / mask.sum(1))
  want = -np.minimum(np.minimum(s, 1.15) * adv_b, np.clip(s, 0.8, 1.28) * adv_b)
  np.testing.assert_allclose(loss, want[:, None] * mask, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(diag.ratio_bt)[:, 0], s, rtol=1e-5)
  # s ≈ (1.11, 1.27, 1.17, 1.10) with A ≈ (−1.0, −1.8, +0.6, +1.0): the cap changes row 2
  # (A > 0, s > δ); row 1 (A < 0, δ < s ≤ 1 + ε_high) keeps −A·s, where capping first
  # would have given −A·δ
  np.testing.assert_array_equal(np.asarray(diag.ratio_cap_bt)[:, 0], [0, 0, 1, 0])
  np.testing.assert_allclose(want[1], -adv_b[1] * s[1], rtol=1e-6)
  assert abs(want[1] + adv_b[1] * 1.15) > 0.1


@pytest.mark.parametrize("delta", [1.28, 1.5, 4.0])
def test_ratio_cap_at_or_above_one_plus_eps_high_equals_capping_first(delta):
  logp, old_logp, adv, mask = _trl_ragged_batch()
  loss, _ = policy_loss(logp, old_logp, adv, mask, eps_low=0.2, eps_high=0.28, ratio_cap=delta)
  np.testing.assert_allclose(loss, np_ppo_cap_first(logp, old_logp, adv, mask, 0.2, 0.28, delta),
                             rtol=1e-5, atol=1e-6)


def test_ratio_cap_and_dual_clip_compose():
  # A < 0: L = |A|·clip(ρ, 1 − ε_low, min(c, max(δ, 1 + ε_high))); the smaller bound is active
  for delta, c, r, want, dual, cap in [(4.0, 3.0, 5.0, 3.0, 1, 0), (4.0, 3.0, 3.5, 3.0, 1, 0),
                                       (2.0, 3.0, 5.0, 2.0, 0, 1), (2.0, 3.0, 1.5, 1.5, 0, 0)]:
    logp = jnp.full((1, 1), np.log(r), jnp.float32)
    loss, diag = policy_loss(logp, jnp.zeros((1, 1)), jnp.array([-1.0]), jnp.ones((1, 1)),
                             dual_clip=c, ratio_cap=delta)
    np.testing.assert_allclose(loss, [[want]], rtol=1e-5)
    assert (float(diag.clip_dual_bt[0, 0]), float(diag.ratio_cap_bt[0, 0])) == (dual, cap)


def test_cispo_keeps_gradient_on_clipped_tokens_ppo_does_not():
  r = 1.5
  assert _single_token_grad(policy_loss, np.log(r), 1.0)[1] == 0.0
  _, g = _single_token_grad(cispo_loss, np.log(r), 1.0, convention="two_sided", eps_high=0.2)
  assert g == pytest.approx(-1.2, rel=1e-6)  # −clip(r)·A·∂logπ/∂logπ
  _, g = _single_token_grad(cispo_loss, np.log(r), 1.0, convention="absolute_cap", cap=5.0)
  assert g == pytest.approx(-1.5, rel=1e-5)
  _, g = _single_token_grad(cispo_loss, np.log(7.0), 1.0, convention="absolute_cap", cap=5.0)
  assert g == pytest.approx(-5.0, rel=1e-6)
  _, g = _single_token_grad(cispo_loss, np.log(0.1), -1.0, convention="two_sided", eps_low=0.2)
  assert g == pytest.approx(0.8, rel=1e-6)  # lower bound 1 − ε_low when given
  _, g = _single_token_grad(cispo_loss, np.log(0.1), -1.0)
  assert g == pytest.approx(0.1, rel=1e-5)  # default: no lower bound (paper)


def test_cispo_matches_numpy_and_stops_gradient_into_old_logp():
  logp, old_logp, adv = _inputs(2, spread=0.6)
  r = np.exp(logp - old_logp)
  for kw, w in ((dict(convention="two_sided", eps_low=0.3, eps_high=0.2), np.clip(r, 0.7, 1.2)),
                (dict(convention="absolute_cap", cap=1.3), np.minimum(r, 1.3))):
    loss, diag = cispo_loss(logp, old_logp, adv, MASK, **kw)
    np.testing.assert_allclose(loss, -w * adv * logp * MASK, rtol=1e-5, atol=1e-6)
    g_old = jax.grad(lambda o, kw=kw: jnp.sum(cispo_loss(logp, o, adv, MASK, **kw)[0]))(old_logp)
    np.testing.assert_array_equal(g_old, np.zeros_like(g_old))
  np.testing.assert_array_equal(diag.clip_high_bt, (r > 1.3) * MASK)
  with pytest.raises(ValueError, match="absolute_cap"):
    cispo_loss(logp, old_logp, adv, MASK, convention="one_sided")


def test_sequence_ratio_gives_every_token_the_same_clip_decision():
  # Row 0: token ratios straddle both clip bounds but their geometric mean is ≈ 1.01.
  # Row 1: every token ratio ≈ 1.5, so s = 1.5 > 1.2 and the whole row is clipped.
  ratios = np.array([[2.0, 0.5, 1.3, 0.8], [1.4, 1.6, 1.5, 1.5]], np.float32)
  logp, old_logp = np.log(ratios), np.zeros_like(ratios)
  mask, adv = np.ones_like(ratios), np.ones(2, np.float32)
  tok_loss, tok_diag = policy_loss(logp, old_logp, adv, mask)
  assert 0 < float(tok_diag.clip_high_bt[0].sum()) < 4  # token level: mixed decisions
  for level in ("sequence", "sequence_token"):
    _, diag = policy_loss(logp, old_logp, adv, mask, ratio_level=level)
    np.testing.assert_array_equal(diag.clip_high_bt, [[0, 0, 0, 0], [1, 1, 1, 1]])
    grad = _grad_logp(policy_loss, logp, old_logp, adv, mask=mask, ratio_level=level,
                      mode="seq_mean_token_mean")
    s0 = np.exp(np.log(ratios[0]).mean())
    np.testing.assert_allclose(grad[0], np.full(4, -s0 / 4 / 2), rtol=1e-5)  # all equal
    np.testing.assert_array_equal(grad[1], np.zeros(4))  # all clipped together


def test_gspo_token_gradient_is_advantage_weighted_per_token():
  logp, old_logp, adv = _inputs(3, spread=0.05)
  eps = dict(eps_low=0.5, eps_high=0.5)  # keep every sequence ratio unclipped
  grad = _grad_logp(policy_loss, logp, old_logp, adv, mode="seq_mean_token_mean",
                    ratio_level="sequence_token", **eps)
  lengths = MASK.sum(-1)
  s = np.exp([np.mean((logp - old_logp)[i, MASK[i] > 0]) if lengths[i] else 0.0 for i in range(4)])
  n_seq = (lengths > 0).sum()
  expected = -adv * s[:, None] / (n_seq * np.maximum(lengths, 1)[:, None]) * MASK
  np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=1e-7)
  g_old = jax.grad(lambda o: jnp.sum(policy_loss(
      logp, o, adv, MASK, ratio_level="sequence_token")[0]))(jnp.asarray(old_logp))
  np.testing.assert_array_equal(g_old, np.zeros_like(g_old))  # sg(log s_i) really stops
  # with a constant advantage per sequence GSPO-token == GSPO, value and gradient
  adv_b = adv[:, 0]
  for f in (lambda lv: policy_loss(logp, old_logp, adv_b, MASK, ratio_level=lv, **eps)[0],):
    np.testing.assert_allclose(f("sequence_token"), f("sequence"), rtol=1e-6)
  g_seq = _grad_logp(policy_loss, logp, old_logp, adv_b, mode="seq_mean_token_mean",
                     ratio_level="sequence", **eps)
  g_tok = _grad_logp(policy_loss, logp, old_logp, adv_b, mode="seq_mean_token_mean",
                     ratio_level="sequence_token", **eps)
  np.testing.assert_allclose(g_tok, g_seq, rtol=1e-5, atol=1e-8)


def test_gspo_on_length_one_sequences_equals_token_ppo():
  rng = np.random.default_rng(4)
  logp = rng.uniform(-3, -0.1, (6, 3)).astype(np.float32)
  old_logp = (logp + rng.normal(0, 0.8, (6, 3))).astype(np.float32)
  adv = rng.normal(size=6).astype(np.float32)
  mask = np.zeros((6, 3), np.float32)
  mask[np.arange(6), rng.integers(0, 3, 6)] = 1.0  # one real token per sequence
  kw = dict(eps_low=0.2, eps_high=0.28, dual_clip=3.0)
  tok = policy_loss(logp, old_logp, adv, mask, **kw)
  g_tok = _grad_logp(policy_loss, logp, old_logp, adv, mask=mask, **kw)
  for level in ("sequence", "sequence_token"):
    seq = policy_loss(logp, old_logp, adv, mask, ratio_level=level, **kw)
    for a, b in zip(jax.tree.leaves(seq), jax.tree.leaves(tok)):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    g = _grad_logp(policy_loss, logp, old_logp, adv, mask=mask, ratio_level=level, **kw)
    np.testing.assert_allclose(g, g_tok, rtol=1e-5, atol=1e-7)


def test_reinforce_gradient_and_importance_weight():
  logp, old_logp, adv = _inputs(5)
  g = _grad_logp(reinforce_loss, logp, old_logp, adv)
  np.testing.assert_allclose(g, -adv * MASK, rtol=1e-6)  # −A·∇logπ
  g_is = _grad_logp(reinforce_loss, logp, old_logp, adv, importance_weight=True)
  np.testing.assert_allclose(g_is, -adv * np.exp(logp - old_logp) * MASK, rtol=1e-5)
  g_old = jax.grad(lambda o: jnp.sum(reinforce_loss(
      logp, o, adv, MASK, importance_weight=True)[0]))(jnp.asarray(old_logp))
  np.testing.assert_array_equal(g_old, np.zeros_like(g_old))
  # on-policy the IS-weighted REINFORCE gradient equals the PPO gradient
  g_ppo = _grad_logp(policy_loss, logp, logp, adv)
  np.testing.assert_allclose(_grad_logp(reinforce_loss, logp, logp, adv, importance_weight=True),
                             g_ppo, rtol=1e-6)


def test_diagnostics_carry_no_gradient():
  logp, old_logp, adv = _inputs(6)
  def f(lp):
    diag = policy_loss(lp, old_logp, adv, MASK, ratio_level="sequence")[1]
    return sum(jnp.sum(x) for x in jax.tree.leaves(diag))
  np.testing.assert_array_equal(jax.grad(f)(jnp.asarray(logp)), np.zeros_like(logp))


# ---------------------------------------------------------------- Clip-Cov / KL-Cov


def _cov_inputs(seed=7, b=4, t=50):
  rng = np.random.default_rng(seed)
  logp = rng.uniform(-6.0, -0.01, (b, t)).astype(np.float32)
  old_logp = (logp + rng.normal(0, 0.1, (b, t))).astype(np.float32)
  adv = rng.choice([-2.0, 2.0], size=b).astype(np.float32)
  mask = np.ones((b, t), np.float32)
  mask[3, 30:] = 0
  return logp, old_logp, adv, mask


def np_cov(logp, adv_bt, mask):
  """Cui et al. 2025 §4.2: Cov_t = (A_t − Ā)(logπ_t − mean logπ) over the batch's tokens."""
  k = mask > 0
  return (adv_bt - adv_bt[k].mean()) * (logp - logp[k].mean()) * mask


def test_clip_cov_selects_random_tokens_inside_the_band():
  logp, old_logp, adv, mask = _cov_inputs()
  adv_bt = np.broadcast_to(adv[:, None], mask.shape)
  cov = np_cov(logp, adv_bt, mask)
  r = np.exp(logp - old_logp)
  clipped = ((adv_bt > 0) & (r > 1.2)) | ((adv_bt < 0) & (r < 0.8))
  candidates = (mask > 0) & ~clipped & (cov > 1.0) & (cov < 5.0)
  n = int(mask.sum())
  frac = 0.03
  k = max(int(frac * n), 1)
  assert candidates.sum() > k  # the test data must leave a real choice
  picks = []
  for seed in range(3):
    keep = np.asarray(clip_cov_mask(logp, old_logp, adv, mask, key=jax.random.key(seed),
                                    clip_fraction=frac, eps_low=0.2, eps_high=0.2))
    selected = keep == 0
    assert selected.sum() == k and np.all(candidates[selected])
    picks.append(selected)
  assert not np.array_equal(picks[0], picks[1])  # the key drives the choice
  again = clip_cov_mask(logp, old_logp, adv, mask, key=jax.random.key(0), clip_fraction=frac,
                        eps_low=0.2, eps_high=0.2)
  np.testing.assert_array_equal(again == 0, picks[0])  # pure: same key, same choice
  # the loss: PPO elsewhere, zero loss and zero gradient on the selected tokens
  key = jax.random.key(0)
  kw = dict(key=key, clip_fraction=frac, eps_low=0.2, eps_high=0.2)
  loss, diag = clip_cov_loss(logp, old_logp, adv, mask, **kw)
  ppo = np_ppo(logp, old_logp, adv_bt, mask, 0.2, 0.2)
  np.testing.assert_allclose(loss, ppo * ~picks[0], rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(diag.cov_selected_bt, picks[0].astype(np.float32))
  g = _grad_logp(clip_cov_loss, logp, old_logp, adv, mask=mask, **kw)
  assert np.all(g[picks[0]] == 0) and np.any(g[~picks[0] & (mask > 0)] != 0)


def test_clip_cov_with_no_candidates_selects_nothing():
  logp, old_logp, adv, mask = _cov_inputs()
  keep = clip_cov_mask(logp, old_logp, adv, mask, key=jax.random.key(0), cov_low=1e6, cov_high=1e7)
  np.testing.assert_array_equal(keep, np.ones_like(keep))


def test_kl_cov_matches_numpy_top_k():
  logp, old_logp, adv, mask = _cov_inputs(8)
  adv_bt = np.broadcast_to(adv[:, None], mask.shape)
  cov = np.where(mask > 0, np_cov(logp, adv_bt, mask), -np.inf)
  frac, coef = 0.02, 0.7
  k = max(int(frac * mask.sum()), 1)
  top = np.zeros(mask.size, bool)
  top[np.argsort(-cov.ravel(), kind="stable")[:k]] = True
  top = top.reshape(mask.shape)
  log_r = logp - old_logp
  ref = (-adv_bt * np.exp(log_r) + top * coef * np.abs(log_r)) * mask
  loss, diag = kl_cov_loss(logp, old_logp, adv, mask, kl_fraction=frac, kl_coef=coef)
  np.testing.assert_allclose(loss, ref, rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(diag.cov_selected_bt, top.astype(np.float32))


# ---------------------------------------------------------------- registry, jit, errors


def test_registry_lookup_and_error_lists_names():
  assert get_policy_loss("ppo") is policy_loss
  logp, old_logp, adv = _inputs(9)
  np.testing.assert_allclose(
      get_policy_loss("gspo")(logp, old_logp, adv[:, 0], MASK)[0],
      policy_loss(logp, old_logp, adv[:, 0], MASK, ratio_level="sequence")[0])
  with pytest.raises(ValueError, match="cispo.*clip_cov|clip_cov.*cispo"):
    get_policy_loss("grpo++")
  assert {"ppo", "gspo", "gspo_token", "cispo", "reinforce", "clip_cov", "kl_cov"} <= set(POLICY_LOSSES)


def test_losses_under_jit_with_traced_hyper_parameters():
  logp, old_logp, adv = _inputs(10, spread=0.6)
  f = jax.jit(lambda lp, o, a, m, eh: policy_loss(lp, o, a, m, eps_high=eh, dual_clip=3.0))
  for got, want in zip(jax.tree.leaves(f(logp, old_logp, adv, MASK, 0.28)),
                       jax.tree.leaves(policy_loss(logp, old_logp, adv, MASK, eps_high=0.28,
                                                   dual_clip=3.0))):
    np.testing.assert_allclose(got, want, rtol=1e-6)
  g = jax.jit(functools.partial(cispo_loss, convention="absolute_cap", cap=2.0))
  np.testing.assert_allclose(g(logp, old_logp, adv, MASK)[0],
                             cispo_loss(logp, old_logp, adv, MASK, convention="absolute_cap",
                                        cap=2.0)[0], rtol=1e-6)
  h = jax.jit(functools.partial(clip_cov_loss, clip_fraction=0.1))
  np.testing.assert_allclose(h(logp, old_logp, adv, MASK, key=jax.random.key(1))[0],
                             clip_cov_loss(logp, old_logp, adv, MASK, key=jax.random.key(1),
                                           clip_fraction=0.1)[0], rtol=1e-6)


def test_bad_hyper_parameters_raise():
  logp, old_logp, adv = _inputs(11)
  with pytest.raises(ValueError, match="sequence_token"):
    policy_loss(logp, old_logp, adv, MASK, ratio_level="seq")
  with pytest.raises(ValueError, match="dual_clip"):
    policy_loss(logp, old_logp, adv, MASK, dual_clip=1.0)
  with pytest.raises(ValueError, match="ratio_cap"):
    policy_loss(logp, old_logp, adv, MASK, ratio_cap=0.5)
