"""Reward models as rewards: the critic initialised from one, the scorer, checkpoints."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tolerances import assert_close_f32

from rljax.data import CharTokenizer, make_task
from rljax.models import RewardModel, ValueModel, last_token_index, positions_from_mask
from rljax.models.testing import tiny_config
from rljax.rewards import compose
from rljax.rewards import reward_model as rm

TOK = CharTokenizer()


@pytest.fixture(scope="module")
def task():
  return make_task("arithmetic", difficulty=(1, 3), seed=0, n_heldout=64)


@pytest.fixture(scope="module")
def model():
  return RewardModel(tiny_config(vocab_size=TOK.vocab_size), rngs=nnx.Rngs(0))


def _right_padded(task, n, s=64):
  """`encode_sequence` rows of n held-out prompts with their demonstrations, [n, s]."""
  prompts = task.heldout_prompts()[:n]
  tokens, attention = np.full((n, s), TOK.pad_id, np.int32), np.zeros((n, s), np.int32)
  for i, p in enumerate(prompts):
    ids = rm.encode_sequence(TOK, p.text, task.demonstration(p))
    tokens[i, :len(ids)], attention[i, :len(ids)] = ids, 1
  return jnp.asarray(tokens), jnp.asarray(attention)


@nnx.jit
def _critic_values(critic, tokens, attention):
  return critic(tokens, positions=positions_from_mask(attention), attention_mask=attention)


@nnx.jit
def _scores(model, tokens, attention):
  return model.score(tokens, positions_from_mask(attention), attention,
                     last_token_index(attention))


def test_critic_initialised_from_reward_model_equals_score_at_eos(task, model):
  critic = ValueModel.from_reward_model(model)
  tokens, attention = _right_padded(task, 20)
  last = last_token_index(attention)
  values = _critic_values(critic, tokens, attention)
  scores = _scores(model, tokens, attention)
  # the critic's per-token forward vs the scorer's: two programs of one trunk
  assert_close_f32(values[jnp.arange(20), last], scores, ulps=256)
  # The trainer's layout is left-padded; with mask-derived positions the score is the same.
  shift = jnp.sum(attention == 0, axis=1)
  idx = (jnp.arange(tokens.shape[1])[None, :] - shift[:, None]) % tokens.shape[1]
  left_tok, left_att = jnp.take_along_axis(tokens, idx, 1), jnp.take_along_axis(attention, idx, 1)
  left_values = _critic_values(critic, left_tok, left_att)
  assert_close_f32(left_values[:, -1], scores, ulps=256)   # left- vs right-padded forward


def test_scorer_matches_batched_scores_and_composes(task, model):
  scorer = rm.RewardModelScorer(model, TOK, batch_size=8, buckets=(64,))
  scorer.warmup(64, rows=(1, 8))
  compiled = rm._score_rows._cache_size()
  prompts = task.heldout_prompts()[:3]
  completions = [task.demonstration(p) for p in prompts] + ["3+", "1\n<answer>2</answer>"]
  prompts = prompts + prompts[:2]
  batch = scorer.score_batch(prompts, completions)
  singles = np.array([scorer(p, c) for p, c in zip(prompts, completions)])
  assert_close_f32(batch, singles, ulps=256)   # 8-row vs 1-row programs of one forward
  assert rm._score_rows._cache_size() == compiled  # warmup compiled every program used
  ids = [rm.encode_sequence(TOK, p.text, c) for p, c in zip(prompts, completions)]
  tokens = np.zeros((5, 64), np.int32)
  attention = np.zeros((5, 64), np.int32)
  for i, row in enumerate(ids):
    tokens[i, :len(row)], attention[i, :len(row)] = row, 1
  ref = _scores(model, jnp.asarray(tokens), jnp.asarray(attention))
  assert_close_f32(batch, ref, ulps=256)   # the scorer's bucketed program vs a plain forward
  out = compose([("rm", scorer, 2.0)], timeout=None)(prompts, completions)
  # compose scores the rows again in its own batches: other programs of the same forward
  assert_close_f32(out.components["rm"], batch, ulps=256)
  assert_close_f32(out.total, 2 * batch, ulps=256)


def test_checkpoint_round_trip(tmp_path, task, model):
  rm.save_reward_model(model, str(tmp_path / "rm"), tokenizer=TOK)
  scorer = rm.RewardModelScorer.from_checkpoint(str(tmp_path / "rm"))
  prompts = task.heldout_prompts()[:2]
  completions = [task.demonstration(p) for p in prompts]
  np.testing.assert_allclose(scorer.score_batch(prompts, completions),
                             rm.RewardModelScorer(model, TOK).score_batch(prompts, completions),
                             rtol=1e-6)
  with pytest.raises(FileNotFoundError, match="neither"):
    rm.load_reward_model(str(tmp_path))
