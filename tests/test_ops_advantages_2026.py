"""OPO, GPG, GRPO pass@k, the optimal token baseline, PF-PPO weights, the IS-corrected KL
and reference mixing, against NumPy references written from their definitions."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tolerances import assert_close_f32

from rljax.ops import advantages_group as ag
from rljax.ops.advantages import group_advantages
from rljax.ops.kl import is_corrected_kl, kl_estimate
from rljax.train.reference import mix_reference


def test_opo_uses_the_length_weighted_baseline():
  scores = np.array([[1.0, 0.0, 1.0, 0.0], [2.0, 2.0, 5.0, 0.0]], np.float32)
  lengths = np.array([[10, 30, 20, 40], [5, 5, 5, 5]], np.float32)
  valid = np.array([[1, 1, 1, 1], [1, 1, 1, 0]], np.float32)
  got = ag.opo_advantages(scores, lengths, mask_bg=valid)
  b0 = (10 * 1 + 20 * 1) / 100.0
  np.testing.assert_allclose(got[0], scores[0] - b0, rtol=1e-6)
  np.testing.assert_allclose(got[1], [2 - 3.0, 2 - 3.0, 5 - 3.0, 0.0], rtol=1e-6)
  # equal lengths: OPO is Dr.GRPO (group mean, no std)
  eq = ag.opo_advantages(scores, np.full_like(lengths, 7.0))
  np.testing.assert_allclose(eq, group_advantages(scores, scale_by_std=False), rtol=1e-6)
  single = ag.opo_advantages(scores, lengths, mask_bg=np.array([[1, 0, 0, 0]] * 2, np.float32))
  np.testing.assert_allclose(single[:, 0], scores[:, 0])   # no baseline for one sample


def test_gpg_alpha_rescales_by_the_fraction_of_informative_samples():
  scores = np.array([[1, 0, 0, 1], [1, 1, 1, 1], [0, 0, 0, 0]], np.float32)
  got = ag.gpg_advantages(scores, f_norm=2.0)
  alpha = 12 / (12 - 8)   # 8 of the 12 samples sit in all-equal groups
  np.testing.assert_allclose(got[0], alpha * (scores[0] - 0.5) / 2.0, rtol=1e-6)
  np.testing.assert_allclose(got[1:], 0.0)
  informative = np.array([[1, 0, 0, 1], [1, 0, 1, 1]], np.float32)   # α = 1: Dr.GRPO
  np.testing.assert_allclose(ag.gpg_advantages(informative),
                             group_advantages(informative, scale_by_std=False), rtol=1e-6)


def test_grpo_passk_credits_only_the_best_sample_by_its_margin():
  scores = np.array([[0.2, 0.9, 0.5, 0.1], [1.0, 1.0, 0.0, 0.0]], np.float32)
  got = np.asarray(ag.grpo_passk_advantages(scores, eps=1e-6))
  std0 = np.std(scores[0], ddof=1)
  np.testing.assert_allclose(got[0], [0, (0.9 - 0.5) / (std0 + 1e-6), 0, 0], rtol=1e-5)
  np.testing.assert_allclose(got[1], 0.0)   # a tie at the top: the margin is 0
  raw = ag.grpo_passk_advantages(scores, scale_by_std=False)
  np.testing.assert_allclose(np.asarray(raw)[0], [0, 0.4, 0, 0], rtol=1e-5)


def np_otb(returns, logp, sum_sq, mask, eps=1e-8):
  """Optimal token baseline from its definition, with explicit loops."""
  b, g, t = returns.shape
  out = np.zeros_like(returns)
  for p in range(b):
    w = np.zeros((g, t))
    for i in range(g):
      acc = 0.0
      for s in range(t):
        if mask[p, i, s]:
          acc += 1 - 2 * np.exp(logp[p, i, s]) + sum_sq[p, i, s]
          w[i, s] = acc
    for s in range(t):
      num = sum(returns[p, i, s] * w[i, s] for i in range(g) if mask[p, i, s])
      den = sum(w[i, s] for i in range(g) if mask[p, i, s]) + eps
      for i in range(g):
        if mask[p, i, s]:
          out[p, i, s] = returns[p, i, s] - num / den
  return out


def test_optimal_token_baseline_matches_loop_reference():
  rng = np.random.default_rng(0)
  shape = (2, 3, 5)
  mask = (np.arange(5)[None, None] < rng.integers(1, 6, (2, 3))[..., None]).astype(np.float32)
  returns = np.broadcast_to(rng.integers(0, 2, (2, 3))[..., None], shape).astype(np.float32)
  logp = rng.uniform(-3, -0.05, shape).astype(np.float32)
  sum_sq = np.maximum(np.exp(2 * logp), rng.uniform(0.1, 0.9, shape)).astype(np.float32)
  got = ag.optimal_token_baseline_advantages(returns, logp, sum_sq, mask)
  np.testing.assert_allclose(got, np_otb(returns, logp, sum_sq, mask), rtol=1e-4, atol=1e-5)
  # equal weights at a step (same tokens, same probabilities): the baseline is the group mean
  same = ag.optimal_token_baseline_advantages(returns, np.zeros(shape) - 1, np.full(shape, .5),
                                              np.ones(shape))
  np.testing.assert_allclose(same, returns - returns.mean(axis=1, keepdims=True), atol=1e-5)


def test_pf_ppo_weights_and_resampling():
  r = np.array([0.5, -1.0, 0.0, 1.0, 0.2], np.float32)
  np.testing.assert_allclose(ag.pf_ppo_weights(r, method="pow", power=2.0),
                             np.abs(r) ** 2 + 1e-8, rtol=1e-6)
  np.testing.assert_allclose(ag.pf_ppo_weights(r, method="max_min"),
                             np.array([0, 1, 0, 1, 0]) + 1e-8, rtol=1e-6)
  np.testing.assert_allclose(ag.pf_ppo_weights(r, method="max_random"),
                             np.array([.1, .1, .1, .4, .1]) + 1e-8, rtol=1e-6)
  idx = np.asarray(ag.pf_ppo_resample(jax.random.key(0), ag.pf_ppo_weights(r, method="max_min")))
  assert set(idx.tolist()) <= {1, 3}
  counts = np.bincount(np.asarray(ag.pf_ppo_resample(
      jax.random.key(1), jnp.tile(ag.pf_ppo_weights(r, method="max_random"), 2000))) % 5,
      minlength=5)
  np.testing.assert_allclose(counts / counts.sum(), [.125, .125, .125, .5, .125], atol=0.02)
  with pytest.raises(ValueError, match="max_min"):
    ag.pf_ppo_weights(r, method="top")


def test_is_corrected_kl_reweights_by_the_ratio_and_is_unbiased():
  rng = np.random.default_rng(3)
  logp, old, ref = (rng.uniform(-3, -0.1, (3, 4)).astype(np.float32) for _ in range(3))
  mask = np.ones((3, 4), np.float32)
  got = is_corrected_kl(logp, old, ref, mask, kind="k3")
  d = ref - logp
  # k3 = e^d − d − 1 cancels near d = 0: the bound scales with its terms, not with its value
  w, terms = np.exp(logp - old), np.exp(d) + 1 + np.abs(d)
  assert_close_f32(got, w * (np.exp(d) - d - 1), ulps=16, scale=(w * terms).max())
  assert_close_f32(is_corrected_kl(logp, logp, ref, mask), kl_estimate(logp, ref, "k3"), ulps=16,
                   scale=terms.max())
  # Unbiasedness on a 3-token vocabulary: E_{x~π_old}[r·k3] = KL(π_θ‖π_ref) exactly.
  p_new, p_old, p_ref = np.array([.5, .3, .2]), np.array([.2, .5, .3]), np.array([.4, .4, .2])
  lp = lambda p: np.log(p)[None].astype(np.float32)   # noqa: E731
  est = np.asarray(is_corrected_kl(lp(p_new), lp(p_old), lp(p_ref), np.ones((1, 3))))[0]
  np.testing.assert_allclose(np.sum(p_old * est), np.sum(p_new * np.log(p_new / p_ref)),
                             rtol=1e-5)
  plain = np.asarray(kl_estimate(lp(p_new), lp(p_ref), "k3"))[0]
  assert abs(np.sum(p_old * plain) - np.sum(p_new * np.log(p_new / p_ref))) > 1e-3


def test_mix_reference_is_the_tr_dpo_soft_update():
  ref = {"w": jnp.array([1.0, 2.0]), "b": jnp.array(3.0, jnp.bfloat16)}
  pol = {"w": jnp.array([3.0, 6.0]), "b": jnp.array(5.0, jnp.bfloat16)}
  out = mix_reference(ref, pol, alpha=0.25)
  np.testing.assert_allclose(out["w"], [1.5, 3.0])
  assert out["b"].dtype == jnp.bfloat16 and float(out["b"]) == 3.5
  np.testing.assert_allclose(mix_reference(ref, pol, alpha=1.0)["w"], pol["w"])
