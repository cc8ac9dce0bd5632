"""The samplers record the experts of every token they feed a MoE policy (routing replay's
input): the same ids as the full forward's own routing, in the compact dtype, the sentinel
where nothing was fed; continuous == static; a dense policy records nothing."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rljax.models import Decoder
from rljax.models.moe import no_route, replay_ids_of
from rljax.models.testing import perturb_params, tiny_config, tiny_moe_config
from rljax.sampling import SamplingParams, generate
from rljax.sampling.continuous import generate_continuous

K = 2


@pytest.fixture(scope="module")
def model():
  return perturb_params(Decoder(tiny_moe_config(num_layers=3), rngs=nnx.Rngs(0)), scale=0.3)


def _prompts(b=3, p=6, seed=0):
  rng = np.random.default_rng(seed)
  lengths = np.array([p, 2, 4])[:b]
  mask = (np.arange(p)[None] >= p - lengths[:, None]).astype(np.int32)
  return (rng.integers(3, 97, (b, p)) * mask).astype(np.int32), mask


def _full(out):
  """The trainer's view of a rollout: prompt ++ completion, attention mask, positions."""
  tokens = jnp.concatenate([out.prompt_tokens, out.tokens], axis=1)
  attention = jnp.concatenate([out.prompt_mask, jnp.ones_like(out.tokens)], axis=1)
  return tokens, jnp.maximum(jnp.cumsum(attention, axis=1) - 1, 0), attention


def _fed(out):
  """bool [R, P + T]: the columns the sampler fed and records (real prompt tokens; completion
  tokens before each row's last one)."""
  t = out.tokens.shape[1]
  lengths = np.asarray(out.mask).sum(axis=1)
  completion = np.arange(t)[None] < (lengths - 1)[:, None]
  return np.concatenate([np.asarray(out.prompt_mask) > 0, completion], axis=1)


SAMPLING = SamplingParams(max_new_tokens=8, n=2, stop_tokens=(5, 7))


def test_static_sampler_records_the_full_forwards_routes(model):
  tokens, mask = _prompts()
  out = generate(model, tokens, mask, sampling=SAMPLING, rng=jax.random.key(1))
  r, p, t = 6, tokens.shape[1], SAMPLING.max_new_tokens
  assert out.routes.shape == (r, p + t, model.num_moe_layers, K)
  assert out.routes.dtype == jnp.uint8
  seq, positions, attention = _full(out)
  _, routing = model.routed(seq, positions=positions, attention_mask=attention)
  own = np.asarray(routing.expert_ids).transpose(1, 2, 0, 3)   # [R, S, L, k]
  routes = np.asarray(out.routes).astype(np.int32)
  fed = _fed(out)
  assert fed.sum() > 20
  np.testing.assert_array_equal(np.sort(routes[fed], -1), np.sort(own[fed], -1))
  # never fed: prompt padding, each row's last token, tokens after its stop
  assert (~fed).any() and (routes[~fed] == no_route(np.uint8)).all()
  # replaying them changes nothing: they are the model's own choice
  replayed = model(seq, positions=positions, attention_mask=attention,
                   replay_ids=replay_ids_of(out.routes))
  np.testing.assert_array_equal(
      np.asarray(replayed), np.asarray(model(seq, positions=positions, attention_mask=attention)))


@pytest.mark.parametrize("slots", [6, 2], ids=["resident", "queue"])
def test_continuous_sampler_records_the_static_samplers_routes(model, slots):
  tokens, mask = _prompts()
  static = generate(model, tokens, mask, sampling=SAMPLING, rng=jax.random.key(3))
  cont = generate_continuous(model, tokens, mask, sampling=SAMPLING, rng=jax.random.key(3),
                             slots=slots)
  np.testing.assert_array_equal(np.asarray(cont.tokens), np.asarray(static.tokens))
  np.testing.assert_array_equal(np.asarray(cont.routes), np.asarray(static.routes))


def test_shared_prefill_records_every_samples_prompt_routes(model):
  tokens, mask = _prompts()
  a = generate(model, tokens, mask, sampling=SAMPLING, rng=jax.random.key(4), share_prefill=True)
  b = generate(model, tokens, mask, sampling=SAMPLING, rng=jax.random.key(4))
  np.testing.assert_array_equal(np.asarray(a.routes), np.asarray(b.routes))


def test_a_dense_policy_records_nothing():
  dense = Decoder(tiny_config(), rngs=nnx.Rngs(0))
  tokens, mask = _prompts()
  assert generate(dense, tokens, mask, sampling=SAMPLING, rng=jax.random.key(0)).routes is None
  assert generate_continuous(dense, tokens, mask, sampling=SAMPLING, rng=jax.random.key(0),
                             slots=2).routes is None
