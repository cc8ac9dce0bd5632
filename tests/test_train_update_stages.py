"""The preparation stages on hand-made update batches: each returns a new batch and leaves
its input as it was; the steps and strategies are chosen once from the specs."""

import dataclasses
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.ops.estimators import ADVANTAGE_ESTIMATORS
from rljax.train.config.specs import PolicySourcesSpec, ShapingSpec, TokenWeightSpec
from rljax.train.update.advantages import ESTIMATES, TOKEN_ESTIMATORS, Distiller, _token_level
from rljax.train.update.batch import UpdateBatch
from rljax.train.update.forward import (
    FromUpdate,
    Recompute,
    Sampler,
    correction,
    no_correction,
)
from rljax.train.update.stages import Shaper, Weigher, enabled

SHAPING = ShapingSpec(group=2, max_len=4, missing_eos_penalty=0.0, repetition_penalty=0.0,
                      repetition_ngram=3, soft_overlong=False, overlong_cache_len=0,
                      length_penalty=0.0, reward_norm=False, reward_clip=0.0)
SOURCES = PolicySourcesSpec(
    old_logp_source="recompute", is_correction="none", is_level="token", tis_cap=2.0,
    icepop_low=0.5, icepop_high=5.0, off_policy_correction="none", kl_placement="none",
    kl_estimator="k3", kl_coef=0.0, kl_controller="fixed", kl_target=0.0, kl_horizon=1,
    reference_offload=False, ref_refresh="none", ref_refresh_every=0, ref_mix_alpha=0.0,
    ref_reset_optimizer=False)
WEIGHTS = TokenWeightSpec(psr_weight=1.0, nsr_weight=1.0, high_entropy_fraction=0.0,
                          overlong_filter=False, pf_ppo="none", pf_ppo_power=1.0)


def _batch():
  """2 rows, 3 completion tokens: row 0 truncated with 3 tokens, row 1 with 2."""
  mask = jnp.asarray([[1, 1, 1], [1, 1, 0]], jnp.int32)
  return UpdateBatch(
      prompt_tokens=jnp.ones((2, 2), jnp.int32), prompt_mask=jnp.ones((2, 2), jnp.int32),
      tokens=jnp.asarray([[3, 4, 5], [6, 7, 0]], jnp.int32), completion_mask=mask,
      sampler_logp=jnp.log(jnp.asarray([[0.5, 0.5, 0.5], [0.25, 0.5, 1.0]])),
      truncated=jnp.asarray([True, False]), prompt_lengths=np.asarray([2, 2]),
      lengths=np.asarray([3, 2]), scores=jnp.asarray([1.0, 0.0]),
      valid=jnp.ones(2), keep_loss=np.asarray([1.0, 0.0], np.float32),
      old_logp=jnp.log(jnp.asarray([[0.5, 0.5, 0.5], [0.5, 0.5, 1.0]])),
      entropy=jnp.ones((2, 3)), advantages=jnp.asarray([[1.0] * 3, [-1.0] * 3]))


def test_enabled_keeps_the_set_steps_in_order_and_names_an_unknown_field():
  table = (("reward_clip", "clip"), ("missing_eos_penalty", "eos"), ("reward_norm", "norm"))
  spec = dataclasses.replace(SHAPING, missing_eos_penalty=0.5, reward_clip=2.0)
  assert enabled(spec, table) == ("clip", "eos")
  # a "none" choice is off, another name is on
  table = (("pf_ppo", "resample"), ("overlong_filter", "filter"))
  assert enabled(WEIGHTS, table) == ()
  assert enabled(dataclasses.replace(WEIGHTS, pf_ppo="pow"), table) == ("resample",)
  with pytest.raises(ValueError, match="no_such_flag"):
    enabled(spec, (("no_such_flag", "x"),))


def test_shaper_adds_the_missing_eos_penalty_and_leaves_its_input():
  upd = _batch()
  rollout = types.SimpleNamespace(truncated=np.asarray([True, False]))
  assert Shaper.create(SHAPING).steps == ()
  shaped, moments = Shaper.create(dataclasses.replace(SHAPING, missing_eos_penalty=0.5))(
      upd, rollout, "moments")
  np.testing.assert_array_equal(shaped.scores, [0.5, 0.0])
  np.testing.assert_array_equal(upd.scores, [1.0, 0.0])   # the input batch is unchanged
  assert moments == "moments"


def test_weigher_masks_rows_without_loss_and_truncated_rows_and_weighs_by_tis():
  upd = _batch()
  weigh = Weigher.create(dataclasses.replace(WEIGHTS, overlong_filter=True),
                         Recompute().correction(dataclasses.replace(SOURCES, is_correction="tis")))
  out = weigh(upd, jax.random.key(0))
  # row 0 is truncated (overlong filter), row 1 carries no loss (keep_loss = 0)
  np.testing.assert_array_equal(out.mask, np.zeros((2, 3)))
  # TIS: min(π_trainer / π_sampler, 2) per completion token (0 past the completion)
  np.testing.assert_allclose(out.is_weights, [[1, 1, 1], [2, 1, 0]], rtol=1e-6)
  np.testing.assert_array_equal(out.token_weights, np.ones((2, 3)))
  assert out.rng.shape == (2, 2) and upd.mask is None and upd.is_weights is None


def test_the_old_logp_strategies_choose_their_correction_and_their_old_logps():
  tis = dataclasses.replace(SOURCES, is_correction="tis")
  assert Sampler().correction(tis) is no_correction
  assert correction(SOURCES) is no_correction
  upd = _batch()
  old, entropy, routed = FromUpdate().outputs(None, None, None, upd)
  np.testing.assert_array_equal(old, np.zeros((2, 3)))
  assert routed == {} and FromUpdate().rollout_metrics(upd, with_ref=False) == {}
  zeros = upd._replace(old_logp=old, entropy=entropy)
  after, _ = Recompute().after_update(zeros, None, with_ref=False)
  assert after is zeros


def test_from_update_gives_a_new_batch_with_the_steps_outputs():
  upd = _batch()._replace(mask=jnp.ones((2, 3)), ref_logp=jnp.zeros((2, 3)))
  outputs = {"old_logp": jnp.full((2, 3), -0.5), "entropy": jnp.full((2, 3), 0.25)}
  after, metrics = FromUpdate().after_update(upd, outputs, with_ref=False)
  np.testing.assert_array_equal(after.old_logp, outputs["old_logp"])
  np.testing.assert_array_equal(upd.entropy, np.ones((2, 3)))   # the input is unchanged
  assert metrics["train/entropy_rollout"] == pytest.approx(0.25)


def test_distiller_with_only_the_teacher_zeroes_the_estimators_scores_not_the_batchs():
  upd = _batch()
  teacher_logp = jnp.log(jnp.asarray([[0.25, 0.5, 0.5], [0.5, 0.5, 1.0]]))
  fns = types.SimpleNamespace(policy_stats=lambda params, seq: (teacher_logp, None))
  spec = types.SimpleNamespace(distill_mode="reward", distill_coef=2.0,
                               distill_only=True)
  distiller = Distiller(spec=spec, fns=fns, teacher=types.SimpleNamespace(params=None))
  scored = distiller.score(upd, None)
  # c·(log π_s − log π_t): 2·log 2 on row 0's first token, 0 elsewhere
  want = np.zeros((2, 3))
  want[0, 0] = 2 * np.log(2.0)
  np.testing.assert_allclose(scored.distill_penalty, want, rtol=1e-6, atol=1e-7)
  np.testing.assert_array_equal(distiller.reward(scored).scores, [0.0, 0.0])
  np.testing.assert_array_equal(scored.scores, [1.0, 0.0])
  assert upd.teacher_logp is None and upd.distill_penalty is None


def test_weigher_weighs_by_sign_and_keeps_the_high_entropy_tokens():
  upd = _batch()._replace(entropy=jnp.asarray([[3.0, 1.0, 2.0], [0.5, 4.0, 9.0]]))
  spec = dataclasses.replace(WEIGHTS, psr_weight=0.25, nsr_weight=2.0,
                             high_entropy_fraction=0.4)
  weigh = Weigher.create(spec, no_correction)
  assert [f.__name__ for f in weigh.filters] == ["_high_entropy"]
  out = weigh(upd, jax.random.key(0))
  # row 0 has A > 0 (0.25), row 1 A < 0 (2.0); the top 40% of the 5 completion tokens by
  # entropy: 4.0 and 3.0 (row 1's 9.0 is past its completion)
  np.testing.assert_allclose(out.token_weights, [[0.25, 0, 0], [0, 2.0, 0]])
  np.testing.assert_array_equal(out.mask, [[1, 1, 1], [0, 0, 0]])   # row 1 carries no loss
  # with the default weights (1, 1) and no filter every token weighs 1
  plain = Weigher.create(WEIGHTS, no_correction)(upd, jax.random.key(0))
  np.testing.assert_array_equal(plain.token_weights, np.ones((2, 3)))


def test_every_registered_estimator_has_its_estimate_at_its_level():
  token = {n for n, e in ADVANTAGE_ESTIMATORS.items() if e.level == "token"}
  assert set(ESTIMATES) == set(ADVANTAGE_ESTIMATORS)
  assert set(TOKEN_ESTIMATORS) == token
  assert all(ESTIMATES[n].func is _token_level for n in token)


def test_distiller_in_the_advantage_adds_the_teachers_term_and_c_0_adds_nothing():
  upd = _batch()
  teacher_logp = jnp.log(jnp.asarray([[0.25, 0.5, 0.5], [0.5, 0.5, 1.0]]))
  fns = types.SimpleNamespace(policy_stats=lambda params, seq: (teacher_logp, None))
  teacher = types.SimpleNamespace(params=None)
  spec = types.SimpleNamespace(distill_mode="advantage", distill_coef=0.5,
                               distill_only=False)
  distiller = Distiller(spec=spec, fns=fns, teacher=teacher)
  scored = distiller.score(upd, None)
  assert scored.distill_penalty is None
  out = distiller.advantages(distiller.reward(scored))
  want = np.array(upd.advantages)
  want[0, 0] -= 0.5 * np.log(2.0)   # −c·(log π_s − log π_t)
  np.testing.assert_allclose(out.advantages, want, rtol=1e-6)
  for mode in ("advantage", "reward"):
    off = Distiller(spec=types.SimpleNamespace(distill_mode=mode, distill_coef=0.0,
                                               distill_only=False), fns=fns, teacher=teacher)
    done = off.advantages(off.reward(off.score(upd, None)))
    np.testing.assert_array_equal(done.advantages, upd.advantages)
    np.testing.assert_array_equal(done.scores, upd.scores)
