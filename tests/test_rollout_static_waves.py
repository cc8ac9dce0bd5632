"""The static sampler with `sampling.slots` decodes the rows in waves (only a wave's KV cache
resident): every row gets the tokens it gets when all rows decode at once, since a row's
draws depend only on its own stream."""

import jax
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from tolerances import assert_close_f32

from rljax.models import Decoder
from rljax.models.testing import perturb_params, tiny_config
from rljax.parallel import BATCH_AXES, make_mesh
from rljax.sampling import SamplingParams, generate_rows
from rljax.sampling.streams import default_streams
from rljax.train.rollout.single_turn import in_waves, static_waves

N, PROMPTS, WIDTH = 4, 4, 7
SAMPLING = SamplingParams(max_new_tokens=10, n=N, stop_tokens=(5, 7, 9))


def test_waves_of_rows_give_every_row_its_tokens():
  model = perturb_params(Decoder(tiny_config(), rngs=nnx.Rngs(0)), scale=0.3)
  mesh = make_mesh(data=2, fsdp=2, devices=jax.devices()[:4])
  rng = np.random.default_rng(0)
  lengths = rng.integers(1, WIDTH + 1, PROMPTS)
  mask = (np.arange(WIDTH)[None] >= WIDTH - lengths[:, None]).astype(np.int32)
  tokens = (rng.integers(3, 97, (PROMPTS, WIDTH)) * mask).astype(np.int32)
  rows = NamedSharding(mesh, P(BATCH_AXES))
  put = lambda x: jax.device_put(np.repeat(x, N, axis=0), rows)  # noqa: E731
  streams = jax.device_put(default_streams(PROMPTS * N, N), rows)

  def sample(t, m, s, share=False):
    return generate_rows(model, t, m, sampling=SAMPLING, rng=jax.random.key(1), streams=s,
                         share_prefill=share)
  whole = sample(put(tokens), put(mask), streams)
  waves = static_waves(8, PROMPTS * N, 4)
  assert waves == 2
  # 2 rows per shard per wave: a wave splits each prompt's 4 samples (prefill per row)
  out = in_waves(sample, waves, 4, put(tokens), put(mask), streams)
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(whole.tokens))
  np.testing.assert_array_equal(np.asarray(out.mask), np.asarray(whole.mask))
  assert_close_f32(out.logp, whole.logp, ulps=256)
  assert np.asarray(whole.mask).sum(1).min() < SAMPLING.max_new_tokens   # stops happened
  assert out.tokens.sharding.is_equivalent_to(whole.tokens.sharding, 2)


@pytest.mark.parametrize("slots, rows, shards, waves", [(0, 64, 4, 1), (64, 64, 4, 1),
                                                        (16, 64, 4, 4), (256, 8192, 64, 32)])
def test_static_waves(slots, rows, shards, waves):
  assert static_waves(slots, rows, shards) == waves


@pytest.mark.parametrize("slots", [6, 24])   # not a multiple of the 4 shards; not dividing 64
def test_static_waves_that_do_not_split_the_rows_name_the_field(slots):
  with pytest.raises(ValueError, match="sampling.slots"):
    static_waves(slots, 64, 4)
