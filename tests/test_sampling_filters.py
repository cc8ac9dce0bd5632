"""Token filters and SamplingParams: golden values, a NumPy reference, chi-square tests."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats
from tolerances import assert_close_f32

from rljax.sampling import SamplingParams, filter_logits, sample_tokens, truncated_log_softmax
from rljax.sampling.filters import (
    DRAW_BLOCK,
    fast_argmax,
    inverse_cdf_draw,
    min_p_keep,
    top_k_keep,
    top_p_keep,
)


def reference_probs(logits_v, *, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0):
  """The sampled-from distribution, written from the papers' definitions in NumPy (float64).

  temperature (softmax z/τ) -> top-k (Fan et al. 2018) -> top-p (Holtzman et al. 2019:
  smallest most-likely set with mass >= p, on the top-k renormalised distribution) ->
  min-p (Nguyen et al. 2024: p >= min_p · p_max) -> renormalise.
  """
  z = np.asarray(logits_v, np.float64) / temperature
  p = np.exp(z - z.max())
  p /= p.sum()
  keep = np.ones_like(p, bool)
  if top_k:
    keep &= p >= np.sort(p)[::-1][min(top_k, len(p)) - 1]
  q = np.where(keep, p, 0.0) / np.where(keep, p, 0.0).sum()
  if top_p < 1.0:
    order = np.argsort(-q, kind="stable")
    mass = 0.0
    nucleus = np.zeros_like(keep)
    for i in order:
      nucleus[i] = True
      mass += q[i]
      if mass >= top_p:
        break
    keep &= nucleus
  if min_p > 0.0:
    keep &= p >= min_p * p.max()
  out = np.where(keep, p, 0.0)
  return out / out.sum()


PROBS_4 = np.array([0.5, 0.3, 0.15, 0.05])
LOGITS_4 = np.log(PROBS_4).astype(np.float32)


@pytest.mark.parametrize("k,kept", [(1, [1, 0, 0, 0]), (2, [1, 1, 0, 0]), (4, [1, 1, 1, 1])])
def test_top_k_golden(k, kept):
  np.testing.assert_array_equal(top_k_keep(jnp.asarray(LOGITS_4), k=k), np.array(kept, bool))


@pytest.mark.parametrize("p,kept", [
    (0.01, [1, 0, 0, 0]), (0.5, [1, 0, 0, 0]), (0.75, [1, 1, 0, 0]), (0.9, [1, 1, 1, 0]),
    (1.0, [1, 1, 1, 1])])
def test_top_p_golden_smallest_set_with_mass_at_least_p(p, kept):
  # masses of the sorted prefix: 0.5, 0.8, 0.95, 1.0
  np.testing.assert_array_equal(top_p_keep(jnp.asarray(LOGITS_4), p=p), np.array(kept, bool))


@pytest.mark.parametrize("min_p,kept", [
    (0.0, [1, 1, 1, 1]), (0.05, [1, 1, 1, 1]), (0.25, [1, 1, 1, 0]), (0.35, [1, 1, 0, 0]),
    (0.9, [1, 0, 0, 0])])
def test_min_p_golden_threshold_scales_with_max(min_p, kept):
  # threshold min_p · 0.5: 0.025, 0.125, 0.175, 0.45
  np.testing.assert_array_equal(min_p_keep(jnp.asarray(LOGITS_4), min_p=min_p),
                                np.array(kept, bool))


def test_min_p_is_invariant_to_logit_shift_and_top_p_to_order():
  shifted = LOGITS_4 + 7.0
  np.testing.assert_array_equal(min_p_keep(jnp.asarray(shifted), min_p=0.35),
                                min_p_keep(jnp.asarray(LOGITS_4), min_p=0.35))
  perm = np.array([2, 0, 3, 1])
  np.testing.assert_array_equal(top_p_keep(jnp.asarray(LOGITS_4[perm]), p=0.75),
                                np.asarray(top_p_keep(jnp.asarray(LOGITS_4), p=0.75))[perm])


CONFIGS = [
    dict(temperature=1.0),
    dict(temperature=0.6),
    dict(temperature=1.5, top_k=3),
    dict(temperature=1.0, top_p=0.7),
    dict(temperature=0.8, min_p=0.15),
    dict(temperature=1.3, top_k=5, top_p=0.8, min_p=0.05),
]


def _jax_kwargs(cfg):
  return dict(temperature=cfg.get("temperature", 1.0), top_k=cfg.get("top_k", 0),
              top_p=cfg.get("top_p"), min_p=cfg.get("min_p"))


@pytest.mark.parametrize("cfg", CONFIGS)
def test_truncated_log_softmax_matches_numpy_reference(cfg):
  logits_bv = np.random.default_rng(0).normal(size=(6, 12)).astype(np.float32) * 2.0
  got = np.exp(np.asarray(truncated_log_softmax(jnp.asarray(logits_bv), **_jax_kwargs(cfg))))
  want = np.stack([reference_probs(row, **cfg) for row in logits_bv])
  # float32 softmax over V = 12 vs float64: rounding scales with the logits (|z| up to ~6)
  assert_close_f32(got, want, ulps=64, scale=np.abs(logits_bv).max())


def test_filter_logits_drops_with_minus_inf_and_keeps_argmax():
  logits_bv = jnp.asarray(np.random.default_rng(1).normal(size=(5, 9)), jnp.float32)
  out = np.asarray(filter_logits(logits_bv, top_k=2, top_p=0.01, min_p=0.99))
  assert np.all(np.isneginf(out).sum(-1) == 8)
  np.testing.assert_array_equal(np.argmax(out, -1), np.argmax(np.asarray(logits_bv), -1))


@pytest.mark.parametrize("cfg", CONFIGS)
def test_chi_square_empirical_frequencies_match_filtered_distribution(cfg):
  """20k draws with a fixed seed; frequencies vs the exact filtered distribution."""
  n_draws, vocab = 20_000, 8
  logits_v = np.random.default_rng(2).normal(size=vocab).astype(np.float32) * 1.5
  key = jax.random.key(123)
  logits_bv = jnp.broadcast_to(jnp.asarray(logits_v), (n_draws, vocab))
  tokens, logp, logp_full = jax.jit(lambda lg, k: sample_tokens(lg, k, **_jax_kwargs(cfg)))(
      logits_bv, key)
  tokens = np.asarray(tokens)
  want = reference_probs(logits_v, **cfg)
  counts = np.bincount(tokens, minlength=vocab)
  kept = want > 0
  assert counts[~kept].sum() == 0, "a truncated token was sampled"
  assert kept.sum() >= 2
  result = stats.chisquare(counts[kept], want[kept] * n_draws)
  assert result.pvalue > 1e-3, (counts, want * n_draws)
  z = logits_v.astype(np.float64) / cfg.get("temperature", 1.0)
  # float32 log-softmax vs float64: rounding scales with the logits
  assert_close_f32(np.asarray(logp), np.log(want[tokens]), ulps=64, scale=np.abs(z).max())
  full = z - z.max() - np.log(np.exp(z - z.max()).sum())
  assert_close_f32(np.asarray(logp_full), full[tokens], ulps=64, scale=np.abs(z).max())


def test_chi_square_rejects_the_unfiltered_distribution():
  """Power check: top-k=3 samples do not look like the untruncated softmax."""
  vocab, n_draws = 8, 20_000
  logits_v = np.random.default_rng(2).normal(size=vocab).astype(np.float32) * 1.5
  key = jax.random.key(7)
  tokens, _, _ = sample_tokens(jnp.broadcast_to(jnp.asarray(logits_v), (n_draws, vocab)),
                               key, top_k=3)
  counts = np.bincount(np.asarray(tokens), minlength=vocab)
  full = reference_probs(logits_v)
  assert stats.chisquare(counts, full * n_draws).pvalue < 1e-10


def test_greedy_is_argmax_with_zero_logp_and_full_logp():
  logits_bv = jnp.asarray(np.random.default_rng(3).normal(size=(4, 10)), jnp.float32)
  tokens, logp, logp_full = sample_tokens(logits_bv, jax.random.key(0), greedy=True,
                                          temperature=0.5)
  np.testing.assert_array_equal(tokens, np.argmax(np.asarray(logits_bv), -1))
  np.testing.assert_array_equal(logp, np.zeros(4))
  ref = np.asarray(jax.nn.log_softmax(logits_bv / 0.5))[np.arange(4), np.asarray(tokens)]
  # the sampler's log-softmax vs jax.nn.log_softmax: other programs, scale of the logits
  assert_close_f32(logp_full, ref, ulps=64, scale=np.abs(np.asarray(logits_bv) / 0.5).max())


def test_a_rows_draw_does_not_depend_on_rows_appended_after_it():
  """Batch padding appends rows; the real rows' draws must not change."""
  logits_bv = jnp.asarray(np.random.default_rng(4).normal(size=(6, 50)), jnp.float32)
  full, _, _ = sample_tokens(logits_bv, jax.random.key(1), top_p=0.9)
  part, _, _ = sample_tokens(logits_bv[:3], jax.random.key(1), top_p=0.9)
  np.testing.assert_array_equal(np.asarray(full)[:3], part)


def test_fast_argmax_matches_argmax_with_ties():
  x = jnp.asarray([[1.0, 3.0, 3.0, 0.0], [-jnp.inf, -1.0, -jnp.inf, -1.0], [2.0, 2.0, 2.0, 2.0]])
  np.testing.assert_array_equal(fast_argmax(x), [1, 1, 0])
  y = jnp.asarray(np.random.default_rng(5).normal(size=(7, 33)), jnp.float32)
  np.testing.assert_array_equal(fast_argmax(y), jnp.argmax(y, -1))


@pytest.mark.parametrize("kwargs,field", [
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(max_new_tokens=4, temperature=0.0), "temperature"),
    (dict(max_new_tokens=4, temperature=-1.0), "temperature"),
    (dict(max_new_tokens=4, temperature=float("nan")), "temperature"),
    (dict(max_new_tokens=4, top_k=-1), "top_k"),
    (dict(max_new_tokens=4, top_k=2.5), "top_k"),
    (dict(max_new_tokens=4, top_p=0.0), "top_p"),
    (dict(max_new_tokens=4, top_p=1.5), "top_p"),
    (dict(max_new_tokens=4, min_p=-0.1), "min_p"),
    (dict(max_new_tokens=4, min_p=1.1), "min_p"),
    (dict(max_new_tokens=4, n=0), "n"),
    (dict(max_new_tokens=4, greedy=1), "greedy"),
    (dict(max_new_tokens=4, stop_tokens=("a",)), "stop_tokens"),
    (dict(max_new_tokens=4, stop_tokens=(-3,)), "stop_tokens"),
])
def test_sampling_params_errors_name_the_field(kwargs, field):
  with pytest.raises((ValueError, TypeError), match=f"SamplingParams.{field}"):
    SamplingParams(**kwargs)


def test_sampling_params_normalises_and_is_hashable():
  sp = SamplingParams(max_new_tokens=4, stop_tokens=[3, 1, 3], top_p=1)
  assert sp.stop_tokens == (3, 1) and isinstance(sp.top_p, float)
  assert SamplingParams(max_new_tokens=4, stop_tokens=5).stop_tokens == (5,)
  assert hash(sp) == hash(SamplingParams(max_new_tokens=4, stop_tokens=(3, 1)))
  assert SamplingParams(max_new_tokens=2, greedy=True, temperature=0.0).greedy
  with pytest.raises(ValueError, match="SamplingParams.n"):
    sp.replace(n=0)


def test_inverse_cdf_draw_matches_searchsorted_on_the_numpy_cdf():
  """Inversion method by hand: token = first i with F_i >= u·F_V (np.searchsorted 'left')."""
  rng = np.random.default_rng(5)
  probs_bv = rng.random((64, 30)).astype(np.float32) * (rng.random((64, 30)) > 0.4)
  probs_bv[:, 7] += 0.1                                  # every row has mass
  u_b = rng.random(64).astype(np.float32) + np.float32(1e-7)
  got = np.asarray(inverse_cdf_draw(jnp.asarray(probs_bv), jnp.asarray(u_b)))
  cdf = np.cumsum(probs_bv.astype(np.float64), axis=-1)
  want = [np.searchsorted(c, u * c[-1], side="left") for c, u in zip(cdf, u_b)]
  np.testing.assert_array_equal(got, want)


def test_inverse_cdf_draw_never_returns_a_zero_probability_token():
  """Extreme uniforms (u = 1 exactly, u at the smallest float) with zeros at both ends."""
  probs_v = np.array([0, 0, 0.2, 0, 0.5, 0.3, 0, 0], np.float32)
  u_b = np.array([1.0, np.finfo(np.float32).tiny, 0.2, 0.2000001, 0.7, 0.70001, 0.5],
                 np.float32)
  got = np.asarray(inverse_cdf_draw(jnp.broadcast_to(jnp.asarray(probs_v), (7, 8)),
                                    jnp.asarray(u_b)))
  np.testing.assert_array_equal(got, [5, 2, 2, 4, 4, 5, 4])
  assert np.all(probs_v[got] > 0)


@pytest.mark.parametrize("vocab", [DRAW_BLOCK + 1, 3 * DRAW_BLOCK, 5000])
def test_blockwise_draw_matches_searchsorted_on_the_numpy_cdf(vocab):
  """Above `DRAW_BLOCK` tokens (blockwise search, a zero-padded last block or none): the
  first i with F_i >= u·F_V on a float64 NumPy CDF, for rows with truncated (zero) tokens;
  uniforms within 1e-5 of a boundary are left out (float32 sums may round either way)."""
  rng = np.random.default_rng(11)
  probs_bv = rng.random((96, vocab)).astype(np.float32) ** 4
  probs_bv *= rng.random((96, vocab)) > 0.5                   # half the tokens truncated away
  probs_bv[:24, : vocab - 40] = 0.0                            # mass only in the last tokens
  probs_bv[24:48, 40:] = 0.0                                   # mass only in the first tokens
  probs_bv[:, [vocab - 1, 3]] += 0.01                          # every row keeps some mass
  u_b = (rng.random(96) + 1e-7).astype(np.float32)
  got = np.asarray(inverse_cdf_draw(jnp.asarray(probs_bv), jnp.asarray(u_b)))
  cdf = np.cumsum(probs_bv.astype(np.float64), axis=-1)
  cdf /= cdf[:, -1:]
  want = np.array([np.searchsorted(c, u, side="left") for c, u in zip(cdf, u_b)])
  clear = np.array([np.min(np.abs(c - u)) > 1e-5 for c, u in zip(cdf, u_b)])
  assert clear.sum() > 80
  np.testing.assert_array_equal(got[clear], want[clear])
  assert np.all(probs_bv[np.arange(96), got] > 0)


def test_blockwise_draw_never_returns_a_zero_probability_token_at_the_extremes():
  """u = 1, u = the smallest float and u exactly at block boundaries, with whole blocks of
  zeros (the first, the last, padded) around the mass."""
  vocab = 4 * DRAW_BLOCK + 7
  probs_v = np.zeros(vocab, np.float32)
  probs_v[DRAW_BLOCK + 5] = 0.25                              # block 1
  probs_v[3 * DRAW_BLOCK - 1] = 0.5                           # the last token of block 2
  probs_v[3 * DRAW_BLOCK + 2] = 0.25                          # block 3
  u_b = np.array([1.0, np.finfo(np.float32).tiny, 0.25, np.nextafter(np.float32(0.25), 1),
                  0.75, np.nextafter(np.float32(0.75), 1)], np.float32)
  got = np.asarray(inverse_cdf_draw(jnp.broadcast_to(jnp.asarray(probs_v), (6, vocab)),
                                    jnp.asarray(u_b)))
  b = DRAW_BLOCK
  np.testing.assert_array_equal(got, [3 * b + 2, b + 5, b + 5, 3 * b - 1, 3 * b - 1, 3 * b + 2])


def test_blockwise_draw_frequencies_follow_the_probabilities():
  """200,000 draws from one row of 1,500 tokens (three blocks): each token's frequency
  within 5 binomial standard deviations of its probability."""
  rng = np.random.default_rng(3)
  probs_v = (rng.random(1500) ** 8).astype(np.float32)
  draw = jax.jit(lambda u: inverse_cdf_draw(jnp.broadcast_to(jnp.asarray(probs_v),
                                                              (u.shape[0], 1500)), u))
  got = np.concatenate([np.asarray(draw(jnp.asarray((1.0 - rng.random(10_000)).astype(
      np.float32)))) for _ in range(20)])
  p = probs_v.astype(np.float64) / probs_v.sum(dtype=np.float64)
  counts = np.bincount(got, minlength=1500)
  sd = np.sqrt(200_000 * p * (1 - p)) + 1.0
  assert np.all(np.abs(counts - 200_000 * p) < 5 * sd)
