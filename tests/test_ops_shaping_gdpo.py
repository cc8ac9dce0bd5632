"""Missing-EOS and n-gram repetition penalties, GDPO's decoupled normalisation: NumPy
references written from the definitions, hand-computed goldens and relations."""

import numpy as np
import pytest
from tolerances import assert_close_f32

from rljax.ops import advantages_group as ag
from rljax.ops.advantages import group_advantages
from rljax.ops.shaping import missing_eos_penalty, ngram_repetition_penalty


def test_missing_eos_penalty_hits_truncated_samples_only():
  got = missing_eos_penalty(np.array([1, 0, 1, 0]), penalty=0.7)
  np.testing.assert_allclose(got, [-0.7, 0.0, -0.7, 0.0])


def _repetition_reference(tokens, mask, n, max_penalty):
  out = []
  for row, m in zip(tokens, mask):
    seq = [int(t) for t, k in zip(row, m) if k]
    grams = [tuple(seq[i:i + n]) for i in range(len(seq) - n + 1)]
    out.append(0.0 if not grams else -max_penalty * (1 - len(set(grams)) / len(grams)))
  return np.array(out)


def test_repetition_penalty_golden():
  tokens = np.array([[4, 5, 4, 5, 4, 5, 9], [1, 2, 3, 4, 5, 6, 7], [5, 5, 0, 0, 0, 0, 0]])
  mask = np.array([[1] * 6 + [0], [1] * 7, [1, 1, 0, 0, 0, 0, 0]])
  # row 0: bigrams (4,5)(5,4)(4,5)(5,4)(4,5): 2 distinct of 5 -> -(1 - 2/5); the masked 9
  # does not count; row 1: all distinct; row 2: a single bigram
  np.testing.assert_allclose(ngram_repetition_penalty(tokens, mask, n=2, max_penalty=1.0),
                             [-0.6, 0.0, 0.0], atol=1e-6)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_repetition_penalty_equals_the_set_reference(n):
  rng = np.random.default_rng(n)
  tokens = rng.integers(0, 4, (16, 20))      # a small alphabet: many repeats
  lengths = rng.integers(0, 21, 16)
  mask = (np.arange(20)[None] < lengths[:, None]).astype(np.int32)
  got = ngram_repetition_penalty(tokens, mask, n=n, max_penalty=0.5)
  assert_close_f32(got, _repetition_reference(tokens, mask, n, 0.5), ulps=16)   # vs float64
  assert np.all(np.asarray(got) <= 0) and np.all(np.asarray(got) >= -0.5)


def _gdpo_reference(r_bgk, w_k, eps):
  b, g, k = r_bgk.shape
  total = np.zeros((b, g))
  for j in range(k):
    r = r_bgk[..., j]
    mean, std = r.mean(axis=1, keepdims=True), r.std(axis=1, ddof=1, keepdims=True)
    total += w_k[j] * (r - mean) / (std + eps)
  return (total - total.mean()) / (total.std(ddof=1) + eps)


def test_gdpo_equals_the_reference_of_its_equations():
  rng = np.random.default_rng(0)
  r = np.stack([rng.integers(0, 2, (6, 4)), rng.normal(size=(6, 4)),
                rng.integers(0, 3, (6, 4))], axis=-1).astype(np.float32)
  w = np.array([1.0, 0.5, 2.0], np.float32)
  # per-reward and batch mean/std vs NumPy's: other summation orders
  assert_close_f32(ag.gdpo_advantages(r, w, eps=1e-6), _gdpo_reference(r, w, 1e-6), ulps=64)


def _np_masked_whiten_verl(values, mask):
  """verl `masked_whiten`: (x − μ)·rsqrt(var + 1e-8), μ and the Bessel-corrected variance
  over the positions where mask = 1."""
  n = mask.sum()
  mean = (values * mask).sum() / (n + 1e-8)
  var = (((values - mean) ** 2) * mask).sum() / (n + 1e-8) * n / (n - 1)
  return (values - mean) / np.sqrt(var + 1e-8)


def _np_gdpo_verl(r_bgk, w_k, lengths_bg, eps):
  """verl `compute_gdpo_outcome_advantage`: GRPO advantage per reward (torch.std, ddof 1),
  weighted sum, broadcast over each response's tokens, `masked_whiten` on the token mask."""
  b, g, k = r_bgk.shape
  t = int(lengths_bg.max())
  mask = (np.arange(t)[None] < lengths_bg.reshape(-1, 1)).astype(np.float64)   # [B·G, T]
  total = np.zeros(b * g)
  for j in range(k):
    r = r_bgk[..., j].astype(np.float64)
    adv = (r - r.mean(1, keepdims=True)) / (r.std(1, ddof=1, keepdims=True) + eps)
    total += w_k[j] * adv.reshape(-1)
  token_adv = _np_masked_whiten_verl(total[:, None] * mask, mask) * mask
  return token_adv[:, 0].reshape(b, g)        # every response has ≥ 1 token


def _gdpo_batch():
  rng = np.random.default_rng(5)
  r = np.stack([rng.integers(0, 2, (4, 4)), rng.normal(size=(4, 4))], -1).astype(np.float32)
  lengths = rng.integers(1, 40, (4, 4))
  return r, np.array([1.0, 0.5], np.float32), lengths


def test_gdpo_whiten_over_tokens_equals_verl_reference():
  r, w, lengths = _gdpo_batch()
  got = ag.gdpo_advantages(r, w, eps=1e-6, whiten_over="tokens", lengths_bg=lengths)
  np.testing.assert_allclose(got, _np_gdpo_verl(r, w, lengths, 1e-6), rtol=1e-4, atol=1e-5)
  # and it is not the per-sample whitening: long responses weigh more
  samples = ag.gdpo_advantages(r, w, eps=1e-6)
  assert np.abs(np.asarray(got) - np.asarray(samples)).max() > 0.05
  np.testing.assert_allclose(samples, _gdpo_reference(r, w, 1e-6), rtol=1e-5, atol=1e-5)
  with pytest.raises(ValueError, match="lengths_bg"):
    ag.gdpo_advantages(r, w, whiten_over="tokens")
  with pytest.raises(ValueError, match="whiten_over"):
    ag.gdpo_advantages(r, w, whiten_over="sequences")


def test_gdpo_whitening_weights_by_length_with_invalid_samples():
  # "tokens" weighs sample i by |y_i|: with integer lengths it equals the sample
  # whitening of a batch in which sample i is repeated |y_i| times (invalid ones dropped)
  r, w, lengths = _gdpo_batch()
  valid = np.ones((4, 4), np.float32)
  valid[1, 2] = valid[3, 0] = 0
  got = np.asarray(ag.gdpo_advantages(r, w, mask_bg=valid, whiten_over="tokens",
                                      lengths_bg=lengths))
  # the sample-whitened advantages are Σ_k w_k A_k up to an affine map (x ↦ a·x + b,
  # a > 0), which whitening removes again (up to ε)
  summed = np.asarray(ag.gdpo_advantages(r, w, mask_bg=valid, whiten_over="samples"))
  rep = np.repeat(summed[valid > 0], lengths[valid > 0])
  want = (summed - rep.mean()) / (rep.std(ddof=1) + 1e-6)
  np.testing.assert_allclose(got[valid > 0], want[valid > 0], rtol=1e-4, atol=1e-5)
  np.testing.assert_array_equal(got[valid == 0], 0.0)


def test_gdpo_keeps_apart_what_grpo_collapses():
  # Two binary rewards, two samples per group. Group 0: the second sample earns one reward;
  # group 1: it earns both. GRPO on the sum gives both winners the same advantage (the
  # paper's motivating example); GDPO gives the double winner twice the single one.
  r = np.zeros((2, 2, 2), np.float32)
  r[0, 1] = [1, 0]
  r[1, 1] = [1, 1]
  grpo = group_advantages(r.sum(-1))
  assert_close_f32(grpo[0], grpo[1], ulps=64)   # two groups' mean/std: other roundings
  gdpo = np.asarray(ag.gdpo_advantages(r, np.array([1.0, 1.0], np.float32)))
  np.testing.assert_allclose(gdpo[1, 1] / gdpo[0, 1], 2.0, rtol=1e-5)


def test_gdpo_with_one_reward_is_batch_normalised_grpo():
  rng = np.random.default_rng(1)
  r = rng.normal(size=(5, 4)).astype(np.float32)
  grpo = np.asarray(group_advantages(r))
  want = (grpo - grpo.mean()) / (grpo.std(ddof=1) + 1e-6)
  assert_close_f32(ag.gdpo_advantages(r[..., None], np.ones(1, np.float32)), want,
                   ulps=64)   # group then batch normalisation vs NumPy's


def test_sum_of_squared_probabilities_from_hidden_equals_numpy():
  import jax.numpy as jnp

  from rljax.models.logprobs import logprobs_and_sum_sq_from_hidden

  rng = np.random.default_rng(3)
  h = rng.normal(size=(2, 5, 4)).astype(np.float32)
  w = rng.normal(size=(4, 7)).astype(np.float32)
  y = rng.integers(0, 7, (2, 5))
  logp, sum_sq = logprobs_and_sum_sq_from_hidden(jnp.asarray(h), jnp.asarray(y),
                                                 lambda x: x @ w, temperature=0.7, chunk_size=2)
  z = (h @ w) / 0.7
  p = np.exp(z - z.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  # softmax and log-softmax over V = 7, JAX vs NumPy: the rounding scales with the logits
  assert_close_f32(sum_sq, (p ** 2).sum(-1), ulps=64, scale=np.abs(z).max())
  assert_close_f32(logp, np.log(np.take_along_axis(p, y[..., None], -1)[..., 0]), ulps=64,
                   scale=np.abs(z).max())


def test_trainer_optimal_token_baseline_uses_the_reward_to_go_and_the_kernel():
  import jax.numpy as jnp

  from rljax.train.config.specs import AdvantageSpec
  from rljax.train.update.advantages import compute_advantages
  from rljax.train.update.batch import UpdateBatch

  rng = np.random.default_rng(4)
  b, g, t = 2, 3, 4
  mask = (np.arange(t)[None] < rng.integers(1, t + 1, b * g)[:, None]).astype(np.float32)
  batch = {"scores": rng.normal(size=b * g).astype(np.float32), "valid": np.ones(b * g, np.float32),
           "mask": mask, "old_logp": np.log(rng.uniform(0.1, 1, (b * g, t))).astype(np.float32),
           "sampled_logp": np.log(rng.uniform(0.1, 1, (b * g, t))).astype(np.float32),
           "sum_sq": rng.uniform(0.1, 1, (b * g, t)).astype(np.float32)}
  spec = AdvantageSpec(advantage="optimal_token_baseline",
                       kwargs=(("handle_zero_tail", True),), group_size=g, gamma=1.0, lam=1.0,
                       whiten_advantages=False, kl_in_reward=False, kl_estimator="k1")
  fields = {k: jnp.asarray(v) for k, v in batch.items()}
  fields["completion_mask"] = fields.pop("mask")
  rows = dict.fromkeys(UpdateBatch._fields[:UpdateBatch._fields.index("routes")])
  adv, _, _ = compute_advantages(spec, UpdateBatch(**{**rows, **fields}), jnp.float32(0.0))
  # reference: G_t = score on every real token; W = cumsum(1 - 2 pi + sum_sq)
  ret = batch["scores"][:, None] * mask
  w = np.cumsum((1 - 2 * np.exp(batch["sampled_logp"]) + batch["sum_sq"]) * mask, 1) * mask
  ret_g, w_g = ret.reshape(b, g, t), w.reshape(b, g, t)
  base = (ret_g * w_g).sum(1, keepdims=True) / (w_g.sum(1, keepdims=True) + 1e-8)
  want = ((ret_g - base) * mask.reshape(b, g, t)).reshape(b * g, t)
  assert_close_f32(adv, want, ulps=64)   # G − weighted group baseline: signed, can cancel
