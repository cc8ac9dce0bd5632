"""generate(): teacher-forced log-probs, stop handling, determinism, buckets, mesh, bf16."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from scipy import stats
from tolerances import assert_close_f32

from rljax.models import Decoder, ModelConfig
from rljax.parallel import make_mesh, replicated_fraction, shard_model
from rljax.sampling import (
  SamplingParams,
  compile_count,
  generate,
  prepare,
  sampler,
  segments,
  truncated_log_softmax,
)

CFG = ModelConfig(vocab_size=48, hidden_size=32, intermediate_size=64, num_layers=2,
                  num_heads=4, num_kv_heads=2, head_dim=8, attention_bias=True)
PAD = 0


def _prompts(lengths, width, seed=0):
  rng = np.random.default_rng(seed)
  tokens = np.full((len(lengths), width), PAD, np.int32)
  mask = np.zeros((len(lengths), width), np.int32)
  for i, n in enumerate(lengths):
    tokens[i, width - n:] = rng.integers(1, CFG.vocab_size, n)
    mask[i, width - n:] = 1
  return tokens, mask


@pytest.fixture(scope="module")
def model():
  return Decoder(CFG, rngs=nnx.Rngs(0))


def _teacher_forced_logits(model, rollout):
  """Full forward (no cache) over [prompt; completion]; logits predicting each completion token."""
  tokens = jnp.concatenate([rollout.prompt_tokens, rollout.tokens], axis=1)
  mask = jnp.concatenate([rollout.prompt_mask, rollout.mask], axis=1)
  positions = jnp.maximum(jnp.cumsum(mask, axis=1) - 1, 0)
  logits = model(tokens, positions=positions, attention_mask=mask)
  p, t = rollout.prompt_tokens.shape[1], rollout.tokens.shape[1]
  return logits[:, p - 1:p + t - 1]


def _chosen(logp_btv, tokens_bt):
  return np.take_along_axis(np.asarray(logp_btv), np.asarray(tokens_bt)[..., None], -1)[..., 0]


SAMPLING = SamplingParams(max_new_tokens=12, temperature=0.7, top_k=20, top_p=0.9, min_p=0.02,
                          n=2, stop_tokens=(5, 7, 11, 13))


@pytest.fixture(scope="module")
def rollout(model):
  tokens, mask = _prompts([3, 7, 1, 5], width=7)
  return generate(model, tokens, mask, sampling=SAMPLING, rng=jax.random.key(0), pad_id=PAD)


def test_logp_and_logp_full_equal_teacher_forced_forward(model, rollout):
  logits = _teacher_forced_logits(model, rollout)
  m = np.asarray(rollout.mask) > 0
  trunc = truncated_log_softmax(logits, temperature=0.7, top_k=20, top_p=0.9, min_p=0.02)
  full = jax.nn.log_softmax(logits / 0.7, axis=-1)
  # cached decode vs teacher-forced full forward: other matmul/attention sums
  assert_close_f32(np.asarray(rollout.logp)[m], _chosen(trunc, rollout.tokens)[m], ulps=256)
  assert_close_f32(np.asarray(rollout.logp_full)[m], _chosen(full, rollout.tokens)[m], ulps=256)
  assert np.all(np.asarray(rollout.logp)[~m] == 0) and np.all(np.asarray(rollout.logp_full)[~m] == 0)
  assert np.all(np.asarray(rollout.logp) >= np.asarray(rollout.logp_full) - 1e-6)  # renormalised


def test_stop_tokens_mask_padding_and_truncated(rollout):
  tokens, mask = np.asarray(rollout.tokens), np.asarray(rollout.mask)
  assert tokens.shape == mask.shape == (8, 12)
  is_stop = np.isin(tokens, SAMPLING.stop_tokens) & (mask > 0)
  stopped = is_stop.any(axis=1)
  assert 0 < stopped.sum() < 8, "fixture should have both stopped and truncated rows"
  for b in range(8):
    end = np.argmax(is_stop[b]) + 1 if stopped[b] else 12
    np.testing.assert_array_equal(mask[b], np.arange(12) < end)
    assert np.all(tokens[b, end:] == PAD)
    assert not np.isin(tokens[b, :end - 1], SAMPLING.stop_tokens).any()
  np.testing.assert_array_equal(rollout.truncated, ~stopped)
  np.testing.assert_array_equal(rollout.group_id, [0, 0, 1, 1, 2, 2, 3, 3])
  np.testing.assert_array_equal(rollout.lengths, mask.sum(1))
  p_tokens, p_mask = _prompts([3, 7, 1, 5], width=7)
  np.testing.assert_array_equal(rollout.prompt_tokens, np.repeat(p_tokens, 2, 0))
  np.testing.assert_array_equal(rollout.prompt_mask, np.repeat(p_mask, 2, 0))


def test_same_key_same_tokens_independent_of_buckets(model, rollout):
  tokens, mask = _prompts([3, 7, 1, 5], width=7)
  kwargs = dict(sampling=SAMPLING, rng=jax.random.key(0), pad_id=PAD)
  again = generate(model, tokens, mask, **kwargs)
  np.testing.assert_array_equal(again.tokens, rollout.tokens)
  other = generate(model, tokens, mask, batch_bucket=16, prompt_bucket=32, **kwargs)
  np.testing.assert_array_equal(other.tokens, rollout.tokens)
  assert_close_f32(other.logp, rollout.logp, ulps=256)   # other buckets: other shapes and sums
  assert not np.array_equal(
      generate(model, tokens, mask, sampling=SAMPLING, rng=jax.random.key(1)).tokens,
      rollout.tokens)
  # the two completions of a prompt are different draws
  assert not np.array_equal(np.asarray(rollout.tokens)[0], np.asarray(rollout.tokens)[1])


def test_a_longer_run_extends_the_shorter_one(model, rollout):
  """Step t's uniforms depend on (rng, t, row) only, not on T."""
  tokens, mask = _prompts([3, 7, 1, 5], width=7)
  longer = generate(model, tokens, mask, sampling=SAMPLING.replace(max_new_tokens=13),
                    rng=jax.random.key(0), pad_id=PAD)
  np.testing.assert_array_equal(np.asarray(longer.tokens)[:, :12], rollout.tokens)


def test_segment_ends_cover_every_step_once():
  assert segments.segment_ends(96) == [25, 49, 73, 96]
  assert segments.segment_ends(96, max_segments=1) == [96]
  assert segments.segment_ends(20) == [20]            # too short to split
  for t_max in (1, 2, 17, 33, 100, 513):
    ends = segments.segment_ends(t_max)
    assert ends[-1] == max(t_max, 1) and ends == sorted(set(ends)) and len(ends) <= 4


def test_segments_only_where_the_shorter_caches_save_reads():
  """Each segment is another copy of the decode body; `segment_count` keeps them where they
  save >= MIN_SEGMENT_SAVING of the decode steps' reads, here summed step by step."""
  def saving(weights, slot, p, t_max):
    ends = segments.segment_ends(t_max)
    window = lambda t: p + next(end for end in ends if end > t) - 1   # t's segment
    segmented = sum(weights + slot * window(t) for t in range(1, t_max))
    return 1 - segmented / ((t_max - 1) * (weights + slot * (p + t_max - 1)))

  qwen05b, slot_b8 = 494_032_768 * 4, 24 * 2 * 8 * 2 * 64 * 4   # float32; K/V of 24 layers
  assert saving(qwen05b, slot_b8, 64, 128) < 0.01
  assert segments.segment_count(qwen05b, slot_b8, 64, 128) == 1
  assert saving(qwen05b, 8 * slot_b8, 64, 1024) > 0.1       # batch 64, 1k tokens
  assert segments.segment_count(qwen05b, 8 * slot_b8, 64, 1024) == segments.MAX_SEGMENTS
  rng = np.random.default_rng(0)
  for _ in range(200):
    weights, slot = int(10 ** rng.uniform(4, 9)), int(10 ** rng.uniform(2, 6))
    p, t_max = int(rng.integers(1, 300)), int(rng.integers(2, 600))
    want = (len(segments.segment_ends(t_max)) if saving(weights, slot, p, t_max)
            >= segments.MIN_SEGMENT_SAVING else 1)
    assert segments.segment_count(weights, slot, p, t_max) == want, (weights, slot, p, t_max)
  assert segments.segment_count(10, 10**6, 8, 1) == 1      # one token: no decode step


def test_segmented_decode_equals_one_loop_and_teacher_forcing(model, monkeypatch):
  """Decoding in while_loops over growing caches changes nothing but the cost."""
  tokens, mask = _prompts([3, 7, 1, 5], width=7, seed=4)
  sp = SAMPLING.replace(max_new_tokens=40, stop_tokens=(5,))
  assert len(segments.segment_ends(40, max_segments=segments.MAX_SEGMENTS)) == 2
  weight_bytes = sum(x.nbytes for x in jax.tree.leaves(nnx.state(model)))
  slot_bytes = CFG.num_layers * 2 * 4 * CFG.num_kv_heads * CFG.head_dim * 4   # 4 rows, f32
  assert segments.segment_count(weight_bytes, slot_bytes, 7, 40) == 2   # this model segments
  seg = generate(model, tokens, mask, sampling=sp, rng=jax.random.key(2), pad_id=PAD)
  monkeypatch.setattr(segments, "MAX_SEGMENTS", 1)
  sampler._decode_jit.clear_cache()          # MAX_SEGMENTS is read when tracing
  one = generate(model, tokens, mask, sampling=sp, rng=jax.random.key(2), pad_id=PAD)
  sampler._decode_jit.clear_cache()
  np.testing.assert_array_equal(seg.tokens, one.tokens)
  np.testing.assert_array_equal(seg.mask, one.mask)
  assert_close_f32(seg.logp, one.logp, ulps=256)   # segmented vs one loop: other programs
  lengths = np.asarray(seg.mask).sum(1)
  assert lengths.min() < 20 < lengths.max()       # stops in both segments, some run on
  logits = _teacher_forced_logits(model, seg)
  full = _chosen(jax.nn.log_softmax(logits / sp.temperature, axis=-1), seg.tokens)
  m = np.asarray(seg.mask) > 0
  assert_close_f32(np.asarray(seg.logp_full)[m], full[m], ulps=256)   # cached vs full forward


def test_no_recompile_for_new_params_and_prompts_in_the_same_bucket(model):
  m = nnx.clone(model)                          # a separate copy (the fixture stays intact)
  sp = SamplingParams(max_new_tokens=5, temperature=0.9, n=1)
  tokens, mask = _prompts([2, 9, 4], width=9, seed=1)
  first = generate(m, tokens, mask, sampling=sp, rng=jax.random.key(3))
  count = compile_count()
  noise = lambda x: x + 0.05 * jax.random.normal(jax.random.key(7), x.shape, x.dtype)
  nnx.update(m, jax.tree.map(noise, nnx.state(m)))   # new parameters, same structure
  tokens2, mask2 = _prompts([12, 1, 6, 3], width=12, seed=2)   # 4 rows, width 12: same buckets
  second = generate(m, tokens2, mask2, sampling=sp.replace(temperature=1.3), rng=jax.random.key(4))
  third = generate(m, tokens, mask, sampling=sp, rng=jax.random.key(3))
  assert compile_count() == count
  assert not np.array_equal(third.tokens, first.tokens)     # the new params were used
  assert second.tokens.shape == (4, 5)
  generate(m, tokens, mask, sampling=sp.replace(max_new_tokens=6), rng=jax.random.key(3))
  assert compile_count() == count + 1                        # T is part of the program


def test_chi_square_first_token_through_generate(model):
  """2048 completions of one prompt; first-token frequencies vs the exact filtered softmax."""
  sp = SamplingParams(max_new_tokens=1, temperature=1.2, top_k=12, top_p=0.95, n=2048)
  tokens, mask = _prompts([6], width=6, seed=3)
  out = generate(model, tokens, mask, sampling=sp, rng=jax.random.key(5))
  logits = model(jnp.asarray(tokens), positions=jnp.arange(6)[None], attention_mask=jnp.asarray(mask))
  want = np.exp(np.asarray(truncated_log_softmax(logits[0, -1], temperature=1.2, top_k=12,
                                                 top_p=0.95), np.float64))
  counts = np.bincount(np.asarray(out.tokens)[:, 0], minlength=CFG.vocab_size)
  kept = want > 0
  assert counts[~kept].sum() == 0 and kept.sum() >= 5
  assert stats.chisquare(counts[kept], want[kept] / want[kept].sum() * 2048).pvalue > 1e-3


@pytest.mark.parametrize("axes", [dict(data=8), dict(data=2, fsdp=2, tensor=2)])
def test_sharded_on_8_devices_equals_unsharded(model, rollout, axes):
  assert jax.device_count() == 8
  mesh = make_mesh(**axes)
  tokens, mask = _prompts([3, 7, 1, 5], width=7)
  kwargs = dict(sampling=SAMPLING, rng=jax.random.key(0), pad_id=PAD, mesh=mesh)
  sharded = generate(model, tokens, mask, **kwargs)
  assert len(sharded.tokens.sharding.device_set) == 8
  np.testing.assert_array_equal(sharded.tokens, rollout.tokens)
  assert_close_f32(sharded.logp, rollout.logp, ulps=256)   # 8 devices vs 1: other sums
  sharded_model = shard_model(nnx.clone(model), mesh)   # pre-sharded parameters
  assert replicated_fraction(sharded_model) < 1.0 or axes == dict(data=8)
  again = generate(sharded_model, tokens, mask, **kwargs)
  np.testing.assert_array_equal(again.tokens, rollout.tokens)


def test_bf16_sampler_is_close_to_but_not_equal_to_fp32(model, rollout):
  tokens, mask = _prompts([3, 7, 1, 5], width=7)
  sp = SamplingParams(max_new_tokens=12, temperature=0.7, n=2)
  out = generate(model, tokens, mask, sampling=sp, rng=jax.random.key(0), sampler_dtype="bfloat16")
  m = np.asarray(out.mask) > 0
  fp32 = _chosen(jax.nn.log_softmax(_teacher_forced_logits(model, out) / 0.7, -1), out.tokens)
  gap = np.abs(np.asarray(out.logp_full)[m] - fp32[m])
  assert gap.max() > 1e-4 and gap.mean() < 0.05, (gap.max(), gap.mean())
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(nnx.state(model)))  # untouched
  bf16 = nnx.merge(*prepare.split_for_sampling(model, "bfloat16")[:2])     # the copy computes in bf16 too
  assert jnp.dtype(bf16.cfg.dtype) == jnp.bfloat16
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(bf16.init_cache(1, 4)))
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(nnx.state(bf16, nnx.Param)))


def test_rejects_right_padded_or_empty_prompts(model):
  sp = SamplingParams(max_new_tokens=2)
  with pytest.raises(ValueError, match="left-padded"):
    generate(model, np.ones((1, 3), np.int32), np.array([[1, 1, 0]]), sampling=sp,
             rng=jax.random.key(0))
  with pytest.raises(ValueError, match="at least one real token"):
    generate(model, np.ones((2, 3), np.int32), np.array([[1, 1, 1], [0, 0, 0]]), sampling=sp,
             rng=jax.random.key(0))
  with pytest.raises(TypeError, match="SamplingParams"):
    generate(model, np.ones((1, 3), np.int32), np.ones((1, 3)), sampling=dict(max_new_tokens=2),
             rng=jax.random.key(0))


@pytest.mark.parametrize("sampler", ["static", "continuous"])
def test_rejects_token_ids_outside_the_vocabulary(model, sampler):
  """An id >= V (or < 0) where the mask is 1 names the range; XLA's gather would clamp it to
  another token's embedding silently. Padding positions may hold any id."""
  from rljax.sampling.continuous import generate_continuous
  sp = SamplingParams(max_new_tokens=2)
  vocab = model.cfg.vocab_size
  call = (functools.partial(generate_continuous, slots=2) if sampler == "continuous"
          else generate)
  mask = np.array([[0, 1, 1], [1, 1, 1]])
  for bad in (vocab, -1):
    tokens = np.array([[vocab + 5, 3, 4], [5, bad, 6]], np.int32)
    with pytest.raises(ValueError, match=rf"vocabulary \[0, {vocab}\)"):
      call(model, tokens, mask, sampling=sp, rng=jax.random.key(0))
  ok = call(model, np.array([[vocab + 5, 3, 4], [5, vocab - 1, 6]], np.int32), mask, sampling=sp,
            rng=jax.random.key(0))   # the padding position's id is not read
  assert ok.tokens.shape == (2, 2)
