"""Property: values at masked positions never change any output of the ops in ratios,
policy_loss, aggregate and kl — losses in every aggregation mode, averaged diagnostics,
KL estimates, KL-in-reward, and gradients — even when they are extreme (finite) numbers.
Fully masked rows (and a fully masked batch) give finite outputs and zero gradients."""

import functools

import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from rljax.ops.aggregate import AGGREGATION_MODES, aggregate
from rljax.ops.kl import KL_ESTIMATORS, kl_estimate, kl_penalized_rewards
from rljax.ops.policy_loss import (
    cispo_loss,
    clip_cov_loss,
    kl_cov_loss,
    policy_loss,
    reinforce_loss,
)
from rljax.ops.ratios import gspo_token_log_ratio, sequence_log_ratio, token_log_ratio

B, T = 3, 4
SHAPE = (B, T)

LOSSES = {
    "ppo": functools.partial(policy_loss, eps_high=0.28, dual_clip=3.0, ratio_cap=5.0),
    "gspo": functools.partial(policy_loss, ratio_level="sequence", dual_clip=3.0),
    "gspo_token": functools.partial(policy_loss, ratio_level="sequence_token"),
    "cispo_two_sided": functools.partial(cispo_loss, convention="two_sided", eps_low=0.2),
    "cispo_absolute_cap": functools.partial(cispo_loss, convention="absolute_cap", cap=2.0),
    "reinforce_is": functools.partial(reinforce_loss, importance_weight=True),
    "clip_cov": functools.partial(clip_cov_loss, key=jax.random.key(0), clip_fraction=0.2,
                                  cov_low=-10.0, cov_high=10.0, eps_low=0.2, eps_high=0.2),
    "kl_cov": functools.partial(kl_cov_loss, kl_fraction=0.2),
}


def _loss_outputs(name, logp, old_logp, adv, mask):
  out = {}
  fn = LOSSES[name]
  loss, diag = fn(logp, old_logp, adv, mask)
  for mode in AGGREGATION_MODES:
    out[f"{name}/{mode}"] = aggregate(loss, mask, mode, max_len=T)
  for field, value in diag._asdict().items():
    out[f"{name}/diag/{field}"] = (
        aggregate(value, mask, "token_mean") if field.endswith("_bt") else value)
  def total(lp, olp):
    return aggregate(fn(lp, olp, adv, mask)[0], mask, "seq_mean_token_mean")
  g_logp, g_old = jax.grad(total, argnums=(0, 1))(logp, old_logp)
  out[f"{name}/grad_logp"], out[f"{name}/grad_old_logp"] = g_logp, g_old
  return out


def _kl_outputs(logp, ref_logp, mask):
  out = {}
  for kind in KL_ESTIMATORS:
    for st_ in (False, True):
      f = lambda lp, kind=kind, st_=st_: aggregate(
          kl_estimate(lp, ref_logp, kind, straight_through=st_, mask=mask), mask, "token_mean")
      out[f"kl/{kind}/{st_}"], out[f"kl/{kind}/{st_}/grad"] = jax.value_and_grad(f)(logp)
      # without a mask the per-token values at padding are garbage, but `aggregate` drops them
      out[f"kl/{kind}/{st_}/nomask"] = aggregate(
          kl_estimate(logp, ref_logp, kind, straight_through=st_), mask, "seq_mean_token_mean")
  kl_bt = kl_estimate(logp, ref_logp, "k1", mask=mask)
  out["kl/rewards"] = kl_penalized_rewards(jnp.arange(B, dtype=jnp.float32), kl_bt, mask,
                                           beta=0.1)
  return out


@jax.jit
def all_outputs(logp, old_logp, adv_bt, adv_b, ref_logp, mask):
  out = {}
  for name in LOSSES:
    out.update(_loss_outputs(name, logp, old_logp, adv_bt, mask))
  for name in ("ppo", "gspo"):  # per-sequence advantages [B]
    out.update({f"{k}/adv_b": v for k, v in
                _loss_outputs(name, logp, old_logp, adv_b, mask).items()})
  out.update(_kl_outputs(logp, ref_logp, mask))
  for fn in (token_log_ratio, sequence_log_ratio, gspo_token_log_ratio):
    out[fn.__name__] = fn(logp, old_logp, mask)
  return out


def _floats(lo, hi):
  return hnp.arrays(np.float32, SHAPE, elements=st.floats(lo, hi, width=32))


JUNK = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.sampled_from([float(np.float32(v)) for v in (3.4e38, -3.4e38, 1e30, -1e30, 89.0, -104.0, 0.0)]),
)


@st.composite
def batches(draw):
  mask = draw(hnp.arrays(np.float32, SHAPE, elements=st.sampled_from([0.0, 1.0])))
  logp = draw(_floats(-8.0, -0.015625))
  old_logp = logp + draw(_floats(-1.5, 1.5))
  ref_logp = logp + draw(_floats(-3.0, 3.0))
  adv_bt = draw(_floats(-3.0, 3.0))
  adv_b = draw(hnp.arrays(np.float32, (B,), elements=st.floats(-3.0, 3.0, width=32)))
  junk = [draw(hnp.arrays(np.float32, SHAPE, elements=JUNK)) for _ in range(5)]
  return mask, (logp, old_logp, adv_bt, adv_b, ref_logp), junk


def _with_junk(mask, clean, junk):
  logp, old_logp, adv_bt, adv_b, ref_logp = clean
  put = lambda x, j: np.where(mask > 0, x, j).astype(np.float32)
  row_empty = mask.sum(-1) == 0
  adv_b_junk = np.where(row_empty, junk[4][:, 0], adv_b).astype(np.float32)
  return (put(logp, junk[0]), put(old_logp, junk[1]), put(adv_bt, junk[2]), adv_b_junk,
          put(ref_logp, junk[3]))


@given(batches())
def test_masked_values_never_change_any_output(batch):
  mask, clean, junk = batch
  ref = jax.device_get(all_outputs(*clean, mask))
  got = jax.device_get(all_outputs(*_with_junk(mask, clean, junk), mask))
  assert ref.keys() == got.keys()
  for key in ref:
    assert np.all(np.isfinite(got[key])), key
    np.testing.assert_array_equal(got[key], ref[key], err_msg=key)
    if "grad" in key:  # masked positions receive exactly zero gradient
      assert np.all(got[key][mask == 0] == 0), key


def test_fully_masked_rows_and_batch_are_finite_with_zero_gradient():
  rng = np.random.default_rng(0)
  huge = rng.choice([3.4e38, -3.4e38, 1e30, -1e30], size=SHAPE).astype(np.float32)
  clean = (np.full(SHAPE, -1.0, np.float32), np.full(SHAPE, -1.2, np.float32),
           np.ones(SHAPE, np.float32), np.ones(B, np.float32), np.full(SHAPE, -0.5, np.float32))
  for mask in (np.array([[1, 1, 0, 0], [0, 0, 0, 0], [1, 0, 1, 0]], np.float32),
               np.zeros(SHAPE, np.float32)):
    junk = [huge] * 5
    out = jax.device_get(all_outputs(*_with_junk(mask, clean, junk), mask))
    empty = mask.sum(-1) == 0
    for key, value in out.items():
      assert np.all(np.isfinite(value)), key
      if "grad" in key:
        assert np.all(value[empty] == 0), key
    if not mask.any():  # nothing to learn from: every loss and gradient is exactly 0
      for key, value in out.items():
        if "/diag/" not in key:
          assert np.all(value == 0), key
