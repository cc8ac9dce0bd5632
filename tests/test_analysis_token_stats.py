"""Token statistics against NumPy references written from the definitions."""

import math

import numpy as np
import pytest
from tolerances import assert_close_f32

from rljax.analysis import token_stats as ts


def _batch(seed=0, b=6, t=9):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(1, t + 1, b)
  lengths[0] = t
  mask = (np.arange(t)[None] < lengths[:, None]).astype(np.float32)
  logp = np.log(rng.uniform(0.02, 1.0, (b, t)))
  entropy = rng.uniform(0.0, 3.0, (b, t))
  adv_b = rng.normal(size=b)
  return logp, entropy, adv_b, mask


def _garbage_outside(x, mask, value):
  return np.where(mask > 0, x, value)


def test_covariance_matches_numpy_definition():
  logp, entropy, adv_b, mask = _batch()
  adv_bt = np.broadcast_to(adv_b[:, None], mask.shape)
  valid = mask > 0
  lv, av = logp[valid], adv_bt[valid]
  ref = np.mean((lv - lv.mean()) * (av - av.mean()))
  got = ts.logp_advantage_covariance(logp, adv_b, mask)
  # float32 mean of signed products vs float64: the bound scales with the largest product
  terms = np.abs((lv - lv.mean()) * (av - av.mean())).max()
  assert_close_f32(got, ref, ulps=64, scale=terms)
  # Same as np.cov with the population divisor, and per-sequence A == broadcast A.
  assert_close_f32(got, np.cov(lv, av, ddof=0)[0, 1], ulps=64, scale=terms)
  assert_close_f32(ts.logp_advantage_covariance(logp, adv_bt, mask), got, ulps=64, scale=terms)


def test_covariance_golden_and_sign():
  # Confident tokens rewarded, unlikely tokens punished: positive covariance (entropy falls).
  logp = np.log(np.array([[0.9, 0.8], [0.1, 0.2]]))
  adv = np.array([1.0, -1.0])
  mask = np.ones((2, 2))
  lv = logp.ravel()
  ref = np.mean((lv - lv.mean()) * np.array([1, 1, -1, -1]))
  got = ts.logp_advantage_covariance(logp, adv, mask)
  np.testing.assert_allclose(got, ref, rtol=1e-6)
  assert got > 0
  assert ts.logp_advantage_covariance(logp, -adv, mask) == pytest.approx(-got, rel=1e-6)


def test_entropy_quantiles_and_sign_means_match_numpy():
  logp, entropy, adv_b, mask = _batch(seed=1)
  out = ts.token_statistics(logp, entropy, adv_b, mask)
  valid = mask > 0
  h = entropy[valid]
  for key, q in (("p10", 0.1), ("p50", 0.5), ("p90", 0.9)):
    np.testing.assert_allclose(out[f"tokens/entropy_{key}"], np.quantile(h, q), rtol=1e-12)
  adv_bt = np.broadcast_to(adv_b[:, None], mask.shape)
  np.testing.assert_allclose(out["tokens/entropy_pos_adv"], entropy[valid & (adv_bt > 0)].mean())
  np.testing.assert_allclose(out["tokens/entropy_neg_adv"], entropy[valid & (adv_bt < 0)].mean())
  np.testing.assert_allclose(out["tokens/entropy_mean"], h.mean())
  assert out["tokens/count"] == valid.sum()
  np.testing.assert_allclose(out["tokens/highprob_frac"], np.mean(np.exp(logp[valid]) >= 0.5))
  assert all(isinstance(k, str) and "/" in k and isinstance(v, float) for k, v in out.items())


def test_masked_positions_never_change_outputs():
  logp, entropy, adv_b, mask = _batch(seed=2)
  rng = np.random.default_rng(3)
  ratio = np.exp(rng.normal(0, 0.3, mask.shape))
  adv_bt = np.broadcast_to(adv_b[:, None], mask.shape).copy()
  clean = ts.token_statistics(logp, entropy, adv_bt, mask, ratio_bt=ratio)
  for value in (1e6, -1e6, np.nan, np.inf):
    dirty = ts.token_statistics(
        _garbage_outside(logp, mask, value), _garbage_outside(entropy, mask, value),
        _garbage_outside(adv_bt, mask, value), mask,
        ratio_bt=_garbage_outside(ratio, mask, value))
    assert dirty.keys() == clean.keys()
    for key in clean:
      np.testing.assert_allclose(dirty[key], clean[key], rtol=1e-6, err_msg=key)


def test_clip_breakdown_counts_hand_built():
  # p_old:        0.01   0.01   0.9    0.9     (row 0, A > 0)
  # ratio:        1.25   1.1    1.25   1.3
  # row 1 (A < 0) p_old 0.01, 0.9, 0.9, 0.01 ratio 0.7, 0.7, 0.9, 1.5
  logp = np.log(np.array([[0.01, 0.01, 0.9, 0.9], [0.01, 0.9, 0.9, 0.01]]))
  ratio = np.array([[1.25, 1.1, 1.25, 1.3], [0.7, 0.7, 0.9, 1.5]])
  adv = np.array([1.0, -1.0])
  mask = np.ones((2, 4))
  out = ts.clip_breakdown(logp, ratio, adv, mask, eps_low=0.2, eps_high=0.2)
  assert out["tokens/clip_high_lowprob"] == 1  # the p=0.01 token at 1.25
  assert out["tokens/clip_high_highprob"] == 2
  assert out["tokens/clip_low_lowprob"] == 1
  assert out["tokens/clip_low_highprob"] == 1
  assert out["tokens/clip_high_highprob_frac"] == pytest.approx(2 / 8)
  # clip-higher (eps_high 0.28) frees the low-probability token at 1.25.
  wider = ts.clip_breakdown(logp, ratio, adv, mask, eps_low=0.2, eps_high=0.28)
  assert wider["tokens/clip_high_lowprob"] == 0
  assert wider["tokens/clip_high_highprob"] == 1
  # prob_split moves tokens between the groups.
  split = ts.clip_breakdown(logp, ratio, adv, mask, prob_split=0.95)
  assert split["tokens/clip_high_lowprob"] == 3 and split["tokens/clip_high_highprob"] == 0


def test_empty_mask_gives_nan_statistics_and_zero_counts():
  logp, entropy, adv_b, mask = _batch(seed=4)
  out = ts.token_statistics(logp, entropy, adv_b, np.zeros_like(mask),
                            ratio_bt=np.ones_like(mask))
  assert math.isnan(out["tokens/entropy_p50"]) and math.isnan(out["tokens/cov_logp_adv"])
  assert out["tokens/count"] == 0 and out["tokens/clip_high_lowprob_frac"] == 0.0


def test_jit_clip_indicators_agree_with_host_breakdown():
  import jax
  import jax.numpy as jnp

  from rljax.ops.aggregate import aggregate
  from rljax.ops.policy_loss import policy_loss

  logp_old, _, adv_b, mask = _batch(seed=5)
  rng = np.random.default_rng(6)
  logp = logp_old + rng.normal(0, 0.3, mask.shape)
  _, diag = policy_loss(jnp.asarray(logp), jnp.asarray(logp_old), jnp.asarray(adv_b),
                        jnp.asarray(mask), eps_low=0.2, eps_high=0.28)

  @jax.jit
  def fractions(old, low, high, m):
    parts = ts.clip_by_probability_bt(old, low, high, m, prob_split=0.3)
    return {k: aggregate(v, m, "token_mean") for k, v in parts.items()}

  got = fractions(jnp.asarray(logp_old), diag.clip_low_bt, diag.clip_high_bt, jnp.asarray(mask))
  host = ts.clip_breakdown(logp_old, np.asarray(diag.ratio_bt), adv_b, mask, eps_low=0.2,
                           eps_high=0.28, prob_split=0.3)
  for key, value in got.items():
    np.testing.assert_allclose(value, host[f"tokens/{key}_frac"], rtol=1e-6)
  assert sum(host[f"tokens/{k}"] for k in got) > 0  # the batch does clip something
