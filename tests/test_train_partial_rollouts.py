"""Partial rollouts: a request in flight at a weight handoff continues with the new weights;
each token's sampler log-prob is that of the version that sampled it, checked against a
full forward pass of that version; per-token versions in training stay within k."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tolerances import assert_close_f32
from train_micro import micro_config, read_records, spy_versions

from rljax.models import Decoder, ModelConfig
from rljax.sampling import SamplingParams, generate_rows, truncated_log_softmax
from rljax.train.config import ConfigError, base_config, validate
from rljax.train.loop import train
from rljax.train.rollout.partial import (
    SegmentedPolicy,
    column_versions,
    sample_segments,
    segment_starts,
)

CFG = ModelConfig(vocab_size=48, hidden_size=32, intermediate_size=64, num_layers=2,
                  num_heads=4, num_kv_heads=2, head_dim=8)
SAMPLING = SamplingParams(max_new_tokens=12, temperature=0.8, top_k=0, top_p=1.0, n=2,
                          stop_tokens=(5, 7))


def _prompts(lengths, width, seed=0):
  rng = np.random.default_rng(seed)
  tokens = np.zeros((len(lengths), width), np.int32)
  mask = np.zeros((len(lengths), width), np.int32)
  for i, n in enumerate(lengths):
    tokens[i, width - n:] = rng.integers(8, CFG.vocab_size, n)
    mask[i, width - n:] = 1
  return jnp.asarray(np.repeat(tokens, 2, 0)), jnp.asarray(np.repeat(mask, 2, 0))


def _generate(model, tokens, mask, sampling, rng, grouped):
  return generate_rows(model, tokens, mask, sampling=sampling, rng=rng, share_prefill=grouped)


def _full_forward_logp(model, prompt_t, prompt_m, tokens, mask):
  """log π(token) by one uncached forward pass over prompt ++ completion."""
  t = jnp.concatenate([prompt_t, tokens], axis=1)
  m = jnp.concatenate([prompt_m, mask], axis=1)
  positions = jnp.maximum(jnp.cumsum(m, axis=1) - 1, 0)
  logits = model(t, positions=positions, attention_mask=m)
  p, n = prompt_t.shape[1], tokens.shape[1]
  logp = truncated_log_softmax(logits[:, p - 1:p + n - 1], temperature=0.8, top_k=0)
  return np.take_along_axis(np.asarray(logp), np.asarray(tokens)[..., None], -1)[..., 0]


def test_segments_and_column_versions():
  assert segment_starts(12, 3) == [0, 4, 8, 12]
  assert segment_starts(10, 3) == [0, 3, 6, 10]
  np.testing.assert_array_equal(column_versions(5, [2, 3]), [2, 2, 3, 3, 3])
  with pytest.raises(ValueError, match="segments"):
    segment_starts(2, 3)


def test_each_segment_is_sampled_by_its_version_and_ended_rows_stay_ended():
  old, new = Decoder(CFG, rngs=nnx.Rngs(0)), Decoder(CFG, rngs=nnx.Rngs(1))
  tokens, mask = _prompts([3, 6, 1, 4, 5, 2], width=8)
  called, saved = [], []

  def model_at(s):
    called.append(s)
    return (old, new)[s]
  policy = SegmentedPolicy(model_at, segments=2, on_segment=saved.append)
  out_t, out_m, out_l, unfinished = sample_segments(
      _generate, policy, tokens, mask, sampling=SAMPLING, rng=jax.random.key(3))
  assert called == [0, 1] and len(saved) == 1 and saved[0].segment == 1
  out_m, out_l = np.asarray(out_m), np.asarray(out_l)
  split = segment_starts(12, 2)[1]
  # a row's tokens are contiguous from column 0: an ended row gets no new tokens
  lengths = out_m.sum(1)
  assert (out_m == (np.arange(12) < lengths[:, None])).all()
  ended_early = lengths < split
  assert ended_early.any() and (lengths > split).any(), lengths   # both kinds occur
  last = np.asarray(out_t)[np.arange(len(lengths)), lengths - 1]
  np.testing.assert_array_equal(np.asarray(unfinished), ~np.isin(last, SAMPLING.stop_tokens))
  for version, model, cols in ((0, old, slice(0, split)), (1, new, slice(split, 12))):
    ref = _full_forward_logp(model, tokens, mask, out_t, jnp.asarray(out_m))
    m = out_m[:, cols] > 0
    assert m.any(), version
    assert_close_f32(out_l[:, cols][m], ref[:, cols][m], ulps=512)
  # the old version would have given the new segment's tokens other log-probs
  wrong = _full_forward_logp(old, tokens, mask, out_t, jnp.asarray(out_m))[:, split:]
  assert np.abs(wrong - out_l[:, split:])[out_m[:, split:] > 0].max() > 1e-2


def test_resume_from_saved_segment_equals_uninterrupted():
  old, new = Decoder(CFG, rngs=nnx.Rngs(0)), Decoder(CFG, rngs=nnx.Rngs(1))
  tokens, mask = _prompts([3, 6, 1, 4], width=8)
  saved = []
  run = lambda resume: sample_segments(  # noqa: E731
      _generate, SegmentedPolicy(lambda s: (old, new)[s], 2, resume=resume,
                                 on_segment=saved.append),
      tokens, mask, sampling=SAMPLING, rng=jax.random.key(5))
  whole = run(None)
  resumed = run(saved[0])
  for a, b in zip(whole, resumed):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("k", [1, 2])
def test_training_tokens_carry_versions_within_k(k, tmp_path, monkeypatch):
  seen = spy_versions(monkeypatch)
  config = micro_config("grpo", tmp_path, **{
      "task.reward_fns": ["tests/signal_rewards.py:digit_share"], "run.iterations": 4,
      "sampling.max_staleness": k, "sampling.partial_rollouts": True,
      "parallel.num_devices": 1})
  train(config)
  records = read_records(tmp_path / "grpo")
  starts = segment_starts(24, k + 1)
  for (t, versions, mask), record in zip(seen, records):
    assert versions.shape == mask.shape
    expected = column_versions(24, [min(t, max(0, t - k) + s) for s in range(k + 1)])
    assert (versions == expected).all(), (t, versions[0])
    assert (np.diff(versions, axis=1) >= 0).all() and (t - versions <= k).all()
    lags = (t - versions)[mask > 0]
    assert record["staleness/max"] == lags.max() and record["staleness/mean"] == pytest.approx(
        lags.mean(), rel=1e-5)
    if t >= k and (mask[:, starts[-2]:] > 0).any():
      assert lags.min() == 0    # the tail of the long rows is sampled by the trainer's version


@pytest.mark.parametrize("change,field", [
    ({"sampling.max_staleness": 0}, "sampling.max_staleness=0"),
    ({"algo.dynamic_sampling": True}, "algo.dynamic_sampling"),
    ({"sampling.max_new_tokens": 2, "sampling.max_staleness": 2},
     "sampling.max_new_tokens=2"),
])
def test_unsupported_partial_rollout_settings_name_the_field(change, field):
  c = base_config()
  c.sampling.partial_rollouts, c.sampling.max_staleness = True, 1
  for key, value in change.items():
    section, name = key.split(".")
    setattr(getattr(c, section), name, value)
  with pytest.raises(ConfigError, match=re.escape(field)):
    validate(c, num_devices=1)
