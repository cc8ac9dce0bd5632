"""Value and reward heads: golden head values, last-token scoring, critic initialisation."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tolerances import assert_close_f32

from rljax.models import Decoder
from rljax.models.heads import RewardModel, ScalarHead, ValueModel, last_token_index
from rljax.models.testing import tiny_config

CFG = tiny_config(num_layers=1)


def test_scalar_head_golden():
  head = ScalarHead(2, rngs=nnx.Rngs(0))
  head.w[...] = jnp.array([0.5, -1.0])
  head.b[...] = jnp.array(0.25)
  np.testing.assert_allclose(head(jnp.array([[1.0, 2.0], [4.0, 0.0]])), [-1.25, 2.25])


def test_last_token_index_golden():
  mask = jnp.array([[1, 1, 1, 0, 0], [0, 0, 1, 1, 1], [1, 0, 0, 0, 0], [0, 1, 1, 0, 0]])
  np.testing.assert_array_equal(last_token_index(mask), [2, 4, 0, 2])


@nnx.jit
def _call(m, tokens, positions, mask):
  return m(tokens, positions=positions, attention_mask=mask)


@nnx.jit
def _score(rm, tokens, positions, mask, last):
  return rm.score(tokens, positions, mask, last)


def test_reward_scores_eos_token_independent_of_padding_side():
  rm = RewardModel(CFG, rngs=nnx.Rngs(1))
  seq = jnp.array([3, 7, 9, 2], jnp.int32)  # 2 = EOS
  right = jnp.stack([jnp.pad(seq, (0, 3)), jnp.array([4, 5, 6, 8, 1, 1, 2], jnp.int32)])
  rmask = jnp.stack([jnp.pad(jnp.ones(4, jnp.int32), (0, 3)), jnp.ones(7, jnp.int32)])
  left = jnp.stack([jnp.pad(seq, (3, 0)), right[1]])
  lmask = jnp.stack([jnp.pad(jnp.ones(4, jnp.int32), (3, 0)), rmask[1]])
  pos = lambda m: jnp.maximum(jnp.cumsum(m, 1) - 1, 0)
  r_right = _score(rm, right, pos(rmask), rmask, last_token_index(rmask))
  r_left = _score(rm, left, pos(lmask), lmask, last_token_index(lmask))
  # two programs of one forward (left vs right padding, last-token score vs per-token values)
  assert_close_f32(r_right, r_left, ulps=256)
  per_token = _call(rm, right, pos(rmask), rmask)
  assert_close_f32(r_right, per_token[jnp.arange(2), jnp.array([3, 6])], ulps=256)
  assert not np.allclose(r_right[0], per_token[0, 2])  # a different token scores differently


def test_critic_from_reward_model_and_from_policy():
  rm = RewardModel(CFG, rngs=nnx.Rngs(2))
  tokens = jnp.array([[1, 2, 3, 4, 5]], jnp.int32)
  pos, mask = jnp.arange(5)[None], jnp.ones_like(tokens)
  critic = ValueModel.from_reward_model(rm)
  assert_close_f32(_call(critic, tokens, pos, mask), _call(rm, tokens, pos, mask),
                   ulps=256)   # two modules' programs of one trunk and head
  policy = Decoder(CFG, rngs=nnx.Rngs(3))
  critic2 = ValueModel.from_policy(policy, rngs=nnx.Rngs(4))
  hidden = nnx.jit(lambda p: p.hidden_states(tokens, positions=pos, attention_mask=mask))(policy)
  assert_close_f32(_call(critic2, tokens, pos, mask), critic2.head(hidden), ulps=256)
  # the copies are independent: training the critic does not move the reward model
  grads = nnx.jit(nnx.grad(lambda m: jnp.sum(m(tokens, positions=pos, attention_mask=mask))))(
      critic)
  g = jax.tree.leaves(grads)
  assert all(np.all(np.isfinite(np.asarray(x))) for x in g)
  assert np.any(np.asarray(grads["trunk"]["layers"][0]["layer"]["mlp"]["down"][...]) != 0)
  critic.head.b[...] = critic.head.b[...] + 1.0
  assert not np.allclose(critic.head.b[...], rm.head.b[...])
