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
from rljax.train.rollout.single_turn import in_waves, static_waves, wave_rows

N, PROMPTS, WIDTH = 4, 4, 7
SAMPLING = SamplingParams(max_new_tokens=10, n=N, stop_tokens=(5, 7, 9))


def _rows_and_sampler(prompts, mesh, seed):
  """(tokens, mask, streams) of `prompts` random prompts' N samples placed on `mesh`'s
  batch axes, and a sampler of those rows by a tiny perturbed decoder."""
  model = perturb_params(Decoder(tiny_config(), rngs=nnx.Rngs(0)), scale=0.3)
  rng = np.random.default_rng(seed)
  lengths = rng.integers(1, WIDTH + 1, prompts)
  mask = (np.arange(WIDTH)[None] >= WIDTH - lengths[:, None]).astype(np.int32)
  tokens = (rng.integers(3, 97, (prompts, WIDTH)) * mask).astype(np.int32)
  rows = NamedSharding(mesh, P(BATCH_AXES))
  put = lambda x: jax.device_put(np.repeat(x, N, axis=0), rows)  # noqa: E731
  streams = jax.device_put(default_streams(prompts * N, N), rows)

  def sample(t, m, s):
    return generate_rows(model, t, m, sampling=SAMPLING, rng=jax.random.key(seed + 1),
                         streams=s, share_prefill=False)
  return (put(tokens), put(mask), streams), sample


def test_waves_of_rows_give_every_row_its_tokens():
  rows, sample = _rows_and_sampler(PROMPTS, make_mesh(data=2, fsdp=2,
                                                      devices=jax.devices()[:4]), 0)
  whole = sample(*rows)
  waves = static_waves(8, PROMPTS * N, 4)
  assert waves == 2
  # 2 rows per shard per wave: a wave splits each prompt's 4 samples (prefill per row)
  out = in_waves(sample, waves, 4, *rows)
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(whole.tokens))
  np.testing.assert_array_equal(np.asarray(out.mask), np.asarray(whole.mask))
  assert_close_f32(out.logp, whole.logp, ulps=256)
  assert np.asarray(whole.mask).sum(1).min() < SAMPLING.max_new_tokens   # stops happened
  assert out.tokens.sharding.is_equivalent_to(whole.tokens.sharding, 2)


@pytest.mark.parametrize("slots, rows, shards, waves", [
    (0, 64, 4, 1), (64, 64, 4, 1), (16, 64, 4, 4), (256, 8192, 64, 32),
    (24, 64, 4, 3), (6, 64, 4, 16), (8, 12, 1, 2), (3, 8, 4, 2)])
def test_static_waves(slots, rows, shards, waves):
  """At most `slots` rows a wave (a multiple of the shards, >= one row each), every shard's
  rows in the fewest such waves."""
  assert static_waves(slots, rows, shards) == waves
  size = wave_rows(waves, rows, shards)
  assert size % shards == 0 and size * waves >= rows
  assert waves == 1 or size <= max(slots, shards)


@pytest.mark.parametrize("slots, prompts, shards", [(8, 5, 1), (8, 5, 2), (6, 7, 1), (6, 4, 2)])
def test_uneven_waves_pad_and_give_every_row_its_tokens(slots, prompts, shards):
  """Waves that do not split the rows evenly (e.g. 20 rows with slots=8: 3 waves of 7) repeat
  a shard's last row and drop it again: each row's tokens as when all decode at once."""
  rows, sample = _rows_and_sampler(prompts, make_mesh(data=shards,
                                                      devices=jax.devices()[:shards]), 1)
  whole = sample(*rows)
  waves = static_waves(slots, prompts * N, shards)
  assert waves > 1 and (prompts * N // shards) % (wave_rows(waves, prompts * N, shards)
                                                  // shards)   # uneven: padded
  out = in_waves(sample, waves, shards, *rows)
  assert out.tokens.shape == whole.tokens.shape
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(whole.tokens))
  np.testing.assert_array_equal(np.asarray(out.truncated), np.asarray(whole.truncated))
  assert_close_f32(out.logp, whole.logp, ulps=256)
