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
from rljax.train.params.reference import mix_reference


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


def _np_group_mean(scores, valid):
  """Group mean over valid samples; a group with one valid sample has mean 0 (verl)."""
  out = np.zeros(scores.shape[0])
  for p in range(scores.shape[0]):
    vals = scores[p][valid[p] > 0]
    out[p] = vals.mean() if len(vals) > 1 else 0.0
  return out[:, None]


def np_gpg_authors(scores, valid, f_norm):
  """arXiv:2504.02546: α = N/(N − M), M = samples in groups whose valid rewards are equal."""
  n = valid.sum()
  m = sum(valid[p].sum() for p in range(scores.shape[0])
          if len(set(scores[p][valid[p] > 0].tolist())) <= 1)
  alpha = n / max(n - m, 1)
  return alpha * (scores - _np_group_mean(scores, valid)) / f_norm * valid


def np_gpg_verl(scores, valid, f_norm):
  """verl compute_gpg_outcome_advantage on the valid samples: bsz = their number,
  alpha = bsz / count_nonzero(scores).clamp(min=1)."""
  kept = scores[valid > 0]
  alpha = len(kept) / max(int(np.count_nonzero(kept)), 1)
  return alpha * (scores - _np_group_mean(scores, valid)) / f_norm * valid


def test_gpg_alpha_conventions_on_binary_scores():
  # 16 samples: two informative groups (3 correct among them) and two degenerate ones
  scores = np.array([[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]], np.float32)
  ones = np.ones_like(scores)
  authors = np.asarray(ag.gpg_advantages(scores))                 # default: the paper's α
  verl = np.asarray(ag.gpg_advantages(scores, alpha="verl"))
  np.testing.assert_allclose(authors, np_gpg_authors(scores, ones, 1.0), rtol=1e-6)
  np.testing.assert_allclose(verl, np_gpg_verl(scores, ones, 1.0), rtol=1e-6)
  np.testing.assert_allclose(authors[0, 0] / 0.75, 16 / 8, rtol=1e-6)    # α = 2.000
  np.testing.assert_allclose(verl[0, 0] / 0.75, 16 / 7, rtol=1e-6)       # α ≈ 2.286
  with pytest.raises(ValueError, match="authors"):
    ag.gpg_advantages(scores, alpha="paper")


@pytest.mark.parametrize("alpha", ["authors", "verl"])
def test_gpg_alpha_matches_its_reference_with_invalid_samples(alpha):
  rng = np.random.default_rng(2)
  scores = rng.choice([-1.0, 0.0, 0.5, 1.0], (6, 5)).astype(np.float32)
  scores[1] = 0.5                                 # a degenerate group with non-zero scores
  valid = (rng.uniform(size=scores.shape) > 0.2).astype(np.float32)
  valid[2] = [1, 0, 0, 0, 0]                      # one valid sample: mean 0
  ref = {"authors": np_gpg_authors, "verl": np_gpg_verl}[alpha]
  got = ag.gpg_advantages(scores, f_norm=2.0, mask_bg=valid, alpha=alpha)
  np.testing.assert_allclose(got, ref(scores, valid, 2.0), rtol=1e-5, atol=1e-7)


def test_grpo_passk_credits_only_the_best_sample_by_its_margin():
  scores = np.array([[0.2, 0.9, 0.5, 0.1], [1.0, 1.0, 0.0, 0.0]], np.float32)
  got = np.asarray(ag.grpo_passk_advantages(scores, eps=1e-6))
  std0 = np.std(scores[0], ddof=1)
  np.testing.assert_allclose(got[0], [0, (0.9 - 0.5) / (std0 + 1e-6), 0, 0], rtol=1e-5)
  np.testing.assert_allclose(got[1], 0.0)   # a tie at the top: the margin is 0
  raw = ag.grpo_passk_advantages(scores, scale_by_std=False)
  np.testing.assert_allclose(np.asarray(raw)[0], [0, 0.4, 0, 0], rtol=1e-5)


def np_otb_verl(returns, logp, sum_sq, mask, handle_zero_tail, eps=1e-8):
  """verl `compute_optimal_token_baseline_advantage` with explicit loops, per prompt group:
  W = cumsum((1 − 2π + Σπ²)·m); B_t = Σ_i G·W·m / (Σ_i W·m + ε); a group of one keeps
  B = 0; with handle_zero_tail, if the longest response is unique and longer than the
  second-longest, its baseline is 0 from the second-longest length on; A = (G − B)·m."""
  b, g, t = returns.shape
  out = np.zeros_like(returns, dtype=np.float64)
  for p in range(b):
    w = np.zeros((g, t))
    for i in range(g):
      acc = 0.0
      for s in range(t):
        acc += (1 - 2 * np.exp(logp[p, i, s]) + sum_sq[p, i, s]) * mask[p, i, s]
        w[i, s] = acc
    base = np.zeros((g, t))
    if g > 1:
      for s in range(t):
        num = sum(returns[p, i, s] * w[i, s] * mask[p, i, s] for i in range(g))
        den = sum(w[i, s] * mask[p, i, s] for i in range(g)) + eps
        base[:, s] = num / den
      if handle_zero_tail:
        lengths = mask[p].sum(-1)
        longest, second = np.sort(lengths)[-1], np.sort(lengths)[-2]
        if (lengths == longest).sum() == 1 and longest > second:
          base[int(np.argmax(lengths)), int(second):] = 0.0
    out[p] = (returns[p] - base) * mask[p]
  return out


def _otb_inputs():
  rng = np.random.default_rng(0)
  lengths = np.array([[5, 2, 3], [4, 4, 1], [1, 6, 2], [3, 3, 3]])  # unique longest in 0, 2
  shape = (4, 3, 6)
  mask = (np.arange(6)[None, None] < lengths[..., None]).astype(np.float32)
  returns = np.broadcast_to(rng.choice([-1.0, 0.0, 1.0], (4, 3))[..., None], shape)
  returns = (returns + rng.normal(0, 0.1, shape)).astype(np.float32)   # not only outcomes
  logp = rng.uniform(-3, -0.05, shape).astype(np.float32)
  sum_sq = np.maximum(np.exp(2 * logp), rng.uniform(0.1, 0.9, shape)).astype(np.float32)
  return returns, logp, sum_sq, mask


@pytest.mark.parametrize("handle_zero_tail", [True, False])
def test_optimal_token_baseline_matches_verl_reference(handle_zero_tail):
  returns, logp, sum_sq, mask = _otb_inputs()
  got = ag.optimal_token_baseline_advantages(returns, logp, sum_sq, mask,
                                             handle_zero_tail=handle_zero_tail)
  want = np_otb_verl(returns, logp, sum_sq, mask, handle_zero_tail)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_optimal_token_baseline_zero_tail_gives_the_lone_tail_its_return():
  returns, logp, sum_sq, mask = _otb_inputs()
  on = np.asarray(ag.optimal_token_baseline_advantages(returns, logp, sum_sq, mask))  # default
  off = np.asarray(ag.optimal_token_baseline_advantages(returns, logp, sum_sq, mask,
                                                        handle_zero_tail=False))
  # group 0: sample 0 (length 5) is alone at steps 3, 4; group 2: sample 1 at steps 2..5
  tail = np.zeros(mask.shape, bool)
  tail[0, 0, 3:5] = True
  tail[2, 1, 2:6] = True
  np.testing.assert_allclose(off[tail], 0.0, atol=1e-6)               # its own baseline
  np.testing.assert_allclose(on[tail], returns[tail], rtol=1e-6)      # no baseline
  np.testing.assert_allclose(on[~tail], off[~tail], rtol=1e-6)        # nothing else moves
  # equal weights at a step (same tokens, same probabilities): the baseline is the group mean
  shape = returns.shape
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
