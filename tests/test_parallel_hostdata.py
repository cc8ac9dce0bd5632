"""Per-process rows (`rljax.parallel.hostdata`) and `generate_rows`, in one process.

The 2-process behaviour is tested end to end in test_parallel_multiprocess_train.py; here
the row bookkeeping is checked against plain NumPy indexing on an 8-device mesh whose
rows are also replicated (tensor axis), and `generate_rows` on pre-placed rows against
`generate`.
"""

import jax
import numpy as np
import pytest
from flax import nnx
from tolerances import assert_close_f32

from rljax import parallel
from rljax.models import Decoder, ModelConfig
from rljax.sampling import SamplingParams, buckets, generate, generate_rows


@pytest.fixture(scope="module")
def sharding():
  return parallel.batch_sharding(parallel.make_mesh(data=4, fsdp=1, tensor=2))


def test_rows_round_trip_in_any_order(sharding):
  values = np.arange(8 * 3, dtype=np.float32).reshape(8, 3) * 1.5
  rows = parallel.local_rows(sharding, 8)
  np.testing.assert_array_equal(rows, np.arange(8))   # one process holds every row
  perm = np.asarray([5, 2, 7, 0, 1, 6, 3, 4])
  x = parallel.from_local_rows(values[perm], perm, sharding, 8)
  assert x.sharding == sharding and x.shape == (8, 3)
  np.testing.assert_array_equal(np.asarray(x), values)
  np.testing.assert_array_equal(parallel.to_local_rows(x, [6, 1, 1]), values[[6, 1, 1]])
  assert parallel.to_local_rows(x, []).shape == (0, 3)
  tree = parallel.gather({"x": x, "host": values[:2]})
  np.testing.assert_array_equal(tree["x"], values)
  np.testing.assert_array_equal(tree["host"], values[:2])
  assert parallel.any_process(True) and not parallel.any_process(False)
  assert parallel.is_primary()


CFG = ModelConfig(vocab_size=48, hidden_size=32, intermediate_size=64, num_layers=1,
                  num_heads=4, num_kv_heads=2, head_dim=8)
SAMPLING = SamplingParams(max_new_tokens=8, temperature=0.9, top_k=20, n=2, stop_tokens=(5,))


@pytest.mark.parametrize("rows", [8, 16])
def test_generate_rows_equals_generate(rows):
  """The rows the trainer builds per process (repeated n times, padded with one-token rows,
  placed on the batch axes) give `generate`'s completions, whatever the padding."""
  mesh = parallel.make_mesh(data=8)
  model = parallel.shard_model(Decoder(CFG, rngs=nnx.Rngs(0)), mesh)
  rng = np.random.default_rng(1)
  tokens = np.zeros((3, 6), np.int32)
  mask = np.zeros((3, 6), np.int32)
  for i, n in enumerate((2, 6, 4)):
    tokens[i, 6 - n:], mask[i, 6 - n:] = rng.integers(6, 48, n), 1
  key = jax.random.key(3)
  want = generate(model, tokens, mask, sampling=SAMPLING, rng=key, mesh=mesh)
  tokens_rw, mask_rw = buckets.pad_prompts(np.repeat(tokens, 2, 0), np.repeat(mask, 2, 0),
                                           rows=rows, width=8, pad_id=0)
  place = lambda x: jax.device_put(x, parallel.batch_sharding(mesh))  # noqa: E731
  got = generate_rows(model, place(tokens_rw), place(mask_rw), sampling=SAMPLING, rng=key)
  assert got.tokens.shape == (rows, SAMPLING.max_new_tokens)
  for name in ("tokens", "mask", "truncated"):
    np.testing.assert_array_equal(np.asarray(getattr(got, name))[:6],
                                  np.asarray(getattr(want, name)), err_msg=name)
  # padded rows and buckets: other shapes, other sums
  assert_close_f32(np.asarray(got.logp)[:6], np.asarray(want.logp), ulps=256)
