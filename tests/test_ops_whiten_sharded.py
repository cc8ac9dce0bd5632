"""Global (cross-device) normalisation on 8 simulated devices equals the single-device result
on the full batch (normalise over the global batch, not per data-parallel shard, as in
REINFORCE++, arXiv:2501.03262)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from tolerances import assert_close_f32

from rljax.ops import advantages as adv
from rljax.ops import masks, mismatch, shaping

N_DEV = 8
pytestmark = pytest.mark.skipif(jax.device_count() < N_DEV, reason="needs 8 devices")

RNG = np.random.default_rng(0)
B, T = 16, 5  # 2 rows per device


def _mesh():
  return jax.make_mesh((N_DEV,), ("data",), devices=jax.devices()[:N_DEV])


ROWS = P("data")


def _sharded(fn, n_in, out_specs=ROWS):
  """Runs fn on row shards of every input, with axis_name="data" for global moments."""
  mesh = _mesh()
  mapped = jax.jit(jax.shard_map(lambda *a: fn(*a, axis_name="data"), mesh=mesh,
                                 in_specs=(P("data"),) * n_in, out_specs=out_specs))
  rows = jax.sharding.NamedSharding(mesh, P("data"))
  return lambda *a: mapped(*(jax.device_put(x, rows) for x in a))


def _batch():
  x = RNG.normal(1.0, 2.0, size=(B, T)).astype(np.float32)
  lengths = RNG.integers(0, T + 1, size=B)
  lengths[3] = 0  # a fully masked row
  lengths[4:6] = 0  # a device (rows 4-5) with no valid token at all
  m = (np.arange(T)[None] < lengths[:, None]).astype(np.float32)
  return x, m


@pytest.mark.parametrize("shift_mean", [True, False])
def test_global_whiten_equals_full_batch(shift_mean):
  x, m = _batch()
  full = adv.whiten(x, m, shift_mean=shift_mean)
  local = adv.whiten(x[:2], m[:2], shift_mean=shift_mean)
  sharded = _sharded(lambda x, m, axis_name: adv.whiten(x, m, shift_mean=shift_mean,
                                                        axis_name=axis_name), 2)(x, m)
  assert_close_f32(sharded, full, ulps=64)   # psum of 8 partial sums vs one reduction
  assert not np.allclose(local, np.asarray(full)[:2], atol=1e-3)  # per-shard would differ


def test_global_reinforce_pp_equals_full_batch():
  x, m = _batch()
  full = adv.reinforce_pp_advantages(x, m, gamma=0.9)
  sharded = _sharded(lambda r, m, axis_name: adv.reinforce_pp_advantages(
      r, m, gamma=0.9, axis_name=axis_name), 2)(x, m)
  assert_close_f32(sharded, full, ulps=64)   # psum of 8 partial sums vs one reduction


def test_global_batch_std_and_baseline_advantages():
  s = RNG.normal(size=(B, 4)).astype(np.float32)
  full = adv.batch_std_advantages(s)
  sharded = _sharded(lambda s, axis_name: adv.batch_std_advantages(s, axis_name=axis_name),
                     1)(s)
  assert_close_f32(sharded, full, ulps=64)   # psum of 8 partial sums vs one reduction
  m = (RNG.random((B, 4, T)) > 0.4).astype(np.float32)
  full_b = adv.reinforce_pp_baseline_advantages(s, m)
  sharded_b = _sharded(lambda s, m, axis_name: adv.reinforce_pp_baseline_advantages(
      s, m, axis_name=axis_name), 2)(s, m)
  assert_close_f32(sharded_b, full_b, ulps=64)


def test_global_high_entropy_mask_equals_full_batch():
  h = RNG.gamma(1.0, size=(B, T)).astype(np.float32)
  _, m = _batch()
  full = masks.high_entropy_mask(h, m, top_fraction=0.2)
  sharded = _sharded(lambda h, m, axis_name: masks.high_entropy_mask(
      h, m, top_fraction=0.2, axis_name=axis_name), 2)(h, m)
  np.testing.assert_array_equal(sharded, full)


def test_global_running_moments_and_mismatch_diagnostics():
  x, m = _batch()
  full = shaping.RunningMoments.create().update(x, m)
  sharded = _sharded(lambda x, m, axis_name: shaping.RunningMoments.create().update(
      x, m, axis_name=axis_name), 2, out_specs=P())(x, m)
  np.testing.assert_allclose(jnp.stack(sharded), jnp.stack(full), rtol=1e-5)
  ls = (x + RNG.normal(0, 0.3, size=x.shape)).astype(np.float32)
  full_d = mismatch.mismatch_diagnostics(x, ls, m)
  sharded_d = _sharded(lambda a, b, m, axis_name: mismatch.mismatch_diagnostics(
      a, b, m, axis_name=axis_name), 3, out_specs=P())(x, ls, m)
  # means of signed gaps can be ~0: the bound is relative to the largest diagnostic (~1)
  assert_close_f32(jnp.stack(sharded_d), jnp.stack(full_d), ulps=64)


def test_gae_runs_inside_shard_map():
  # The scan carry must be device-varying under shard_map (regression test).
  x, m = _batch()
  v = RNG.normal(size=x.shape).astype(np.float32)
  full = adv.gae(x, v, m, gamma=0.99, lam=0.95)
  sharded = _sharded(lambda r, v, m, axis_name: adv.gae(r, v, m, gamma=0.99, lam=0.95),
                     3, out_specs=(P("data"), P("data")))(x, v, m)
  assert_close_f32(jnp.stack(sharded), jnp.stack(full), ulps=16)   # per-row scans, 2 vs 16 rows
