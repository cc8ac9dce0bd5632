"""Loss aggregation modes, their (sum, denominator) form and micro-batch exactness."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec
from tolerances import assert_close_f32

from rljax.ops.aggregate import AGGREGATION_MODES, aggregate, aggregate_parts

MAX_LEN = 7


def _ragged(seed=0, b=6, t=5):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(b, t)).astype(np.float32)
  lengths = rng.integers(0, t + 1, size=b)
  lengths[1] = 0  # at least one empty row
  lengths[2] = t
  mask = (np.arange(t)[None, :] < lengths[:, None]).astype(np.float32)
  return x, mask


def np_aggregate(x, mask, mode, max_len=None):
  """Reference written from the definitions (empty rows do not count as sequences)."""
  rows = [x[i][mask[i] > 0] for i in range(x.shape[0])]
  nonempty = [r for r in rows if r.size]
  if mode == "token_mean":
    n = sum(r.size for r in rows)
    return sum(r.sum() for r in rows) / n if n else 0.0
  if not nonempty:
    return 0.0
  per_seq = {
      "seq_mean_token_mean": lambda r: r.mean(),
      "seq_mean_token_sum": lambda r: r.sum(),
      "seq_mean_token_sum_norm": lambda r: r.sum() / max_len,
  }[mode]
  return float(np.mean([per_seq(r) for r in nonempty]))


@pytest.mark.parametrize("mode", AGGREGATION_MODES)
def test_matches_numpy_reference(mode):
  for seed in range(3):
    x, mask = _ragged(seed)
    got = aggregate(x, mask, mode, max_len=MAX_LEN)
    # means of signed terms can be ~0: the bound scales with the largest row sum of |x|
    assert_close_f32(got, np_aggregate(x, mask, mode, MAX_LEN), ulps=64,
                     scale=np.abs(x).sum(-1).max())


@pytest.mark.parametrize("mode", AGGREGATION_MODES)
def test_aggregate_is_exactly_sum_over_denominator(mode):
  x, mask = _ragged(3)
  total, den = aggregate_parts(x, mask, mode, max_len=MAX_LEN)
  assert float(aggregate(x, mask, mode, max_len=MAX_LEN)) == float(total / den)


@pytest.mark.parametrize("mode", AGGREGATION_MODES)
def test_micro_batch_accumulation_is_exact(mode):
  x, mask = _ragged(4, b=8)
  mask[5:7] = 0.0  # one micro-batch made only of empty rows
  full = aggregate(x, mask, mode, max_len=MAX_LEN)
  splits = [(0, 3), (3, 5), (5, 7), (7, 8)]
  parts = [aggregate_parts(x[a:b], mask[a:b], mode, max_len=MAX_LEN) for a, b in splits]
  total = sum(float(p[0]) for p in parts)
  den = sum(float(p[1]) for p in parts)
  # float64 sum of the parts vs one float32 reduction: other order, signed terms
  assert_close_f32(total / den, full, ulps=64, scale=np.abs(x).sum(-1).max())
  # Gradient accumulation: Σ_k ∇sum_k / global denominator == ∇aggregate(full batch).
  grad_full = jax.grad(lambda v: aggregate(v, mask, mode, max_len=MAX_LEN))(jnp.asarray(x))
  grad_acc = np.concatenate([
      np.asarray(jax.grad(lambda v, a=a, b=b: aggregate_parts(
          v, mask[a:b], mode, max_len=MAX_LEN)[0])(jnp.asarray(x[a:b]))) / den
      for a, b in splits])
  np.testing.assert_allclose(grad_acc, grad_full, rtol=1e-6, atol=1e-8)


def test_equal_lengths_relations():
  rng = np.random.default_rng(5)
  b, t = 4, 6
  x = rng.normal(size=(b, t)).astype(np.float32)
  mask = np.ones((b, t), np.float32)
  tm = aggregate(x, mask, "token_mean")
  smtm = aggregate(x, mask, "seq_mean_token_mean")
  smts = aggregate(x, mask, "seq_mean_token_sum")
  norm = aggregate(x, mask, "seq_mean_token_sum_norm", max_len=t)
  # one value by other formulas (other summation orders) of signed terms: the bound
  # scales with the largest row sum of |x|, not with the (possibly ~0) mean
  row = np.abs(x).sum(-1).max()
  assert_close_f32(norm, smtm, ulps=64, scale=row)
  assert_close_f32(smts, t * smtm, ulps=64, scale=row)
  assert_close_f32(tm, smtm, ulps=64, scale=row)
  # Same lengths L < T (padding): token_mean == seq_mean_token_mean still; norm scales by L/max_len.
  mask[:, 4:] = 0
  assert_close_f32(aggregate(x, mask, "token_mean"), aggregate(x, mask, "seq_mean_token_mean"),
                   ulps=64, scale=row)
  assert_close_f32(aggregate(x, mask, "seq_mean_token_sum_norm", max_len=t),
                   4 / t * aggregate(x, mask, "seq_mean_token_mean"), ulps=64, scale=row)


def test_empty_rows_do_not_count_and_all_empty_is_zero():
  x = np.array([[1.0, 3.0], [100.0, 100.0]], np.float32)
  mask = np.array([[1, 1], [0, 0]], np.float32)
  assert float(aggregate(x, mask, "seq_mean_token_mean")) == 2.0
  assert float(aggregate(x, mask, "seq_mean_token_sum")) == 4.0
  for mode in AGGREGATION_MODES:
    out = aggregate(x, np.zeros_like(mask), mode, max_len=2)
    assert float(out) == 0.0
    g = jax.grad(lambda v, mode=mode: aggregate(v, jnp.zeros((2, 2)), mode, max_len=2))(x)
    np.testing.assert_array_equal(g, np.zeros_like(x))


def test_errors_name_the_valid_modes():
  x = np.zeros((1, 2), np.float32)
  with pytest.raises(ValueError, match="seq_mean_token_sum_norm"):
    aggregate(x, np.ones_like(x), "sequence_mean")
  with pytest.raises(ValueError, match="max_len"):
    aggregate(x, np.ones_like(x), "seq_mean_token_sum_norm")


@pytest.mark.parametrize("mode", AGGREGATION_MODES)
def test_axis_name_gives_the_global_aggregate_on_8_devices(mode):
  devices = np.array(jax.devices()[:8])
  if devices.size < 8:
    pytest.skip("needs 8 (simulated) devices")
  x, mask = _ragged(6, b=16)
  mesh = Mesh(devices, ("data",))
  fn = jax.shard_map(
      lambda v, m: aggregate(v, m, mode, max_len=MAX_LEN, axis_name="data"),
      mesh=mesh, in_specs=(PartitionSpec("data"), PartitionSpec("data")),
      out_specs=PartitionSpec())
  # psum of 8 partial sums vs one reduction, signed terms: bound from the largest row sum
  assert_close_f32(jax.jit(fn)(x, mask), aggregate(x, mask, mode, max_len=MAX_LEN), ulps=64,
                   scale=np.abs(x).sum(-1).max())
