"""Packed rows (rljax.train.update.packing) give the padded computation's log-probs,
losses and gradients for every aggregation mode and ratio level; the trainer's runs match."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tolerances import assert_close_f32, f32_atol
from train_micro import micro_config, read_records

from rljax.models import Decoder
from rljax.models.testing import perturb_params, tiny_config
from rljax.train.config.specs import loss_spec
from rljax.train.loop import train
from rljax.train.update import objective, packing

SIGNAL = {"task.reward_fns": ["tests/signal_rewards.py:digit_share"]}


def _lengths(b=16, p=6, t=10, seed=0):
  rng = np.random.default_rng(seed)
  return rng.integers(1, p + 1, b), rng.integers(0, t + 1, b)


def test_layout_places_every_real_token_once_and_points_at_the_previous_token():
  p_len, c_len = _lengths()
  lay = packing.pack_layout(p_len, c_len, prompt_width=6, completion_width=10, groups=2)
  s, per = 16, 8
  assert lay.src.shape[1] == s and lay.src.shape[0] % 2 == 0
  k = lay.src.shape[0] // 2
  for g in range(2):
    src = lay.src[g * k:(g + 1) * k]
    placed = np.sort(src[src >= 0])
    want = np.sort(np.concatenate([i * s + np.arange(6 - p_len[g * per + i], 6 + c_len[g * per + i])
                                   for i in range(per)]))
    np.testing.assert_array_equal(placed, want)          # each real token exactly once
    seg = lay.segment[g * k:(g + 1) * k]
    np.testing.assert_array_equal(seg > 0, src >= 0)
    np.testing.assert_array_equal(seg[src >= 0], src[src >= 0] // s + 1)
    for i in range(per):
      r = g * per + i
      for t in range(c_len[r]):   # hidden of completion token t = packed slot of token t - 1
        flat = src.reshape(-1)[lay.hidden[r, t]]
        assert flat == i * s + 6 + t - 1
  # fewer rows than sequences when the lengths leave room
  assert lay.src.shape[0] < 16


def test_row_counts_come_from_at_most_eight_buckets():
  ks = set()
  for seed in range(60):
    p_len, c_len = _lengths(b=64, seed=seed)
    c_len = np.random.default_rng(seed).integers(0, 11, 64) * (seed % 3 == 0)
    ks.add(packing.pack_layout(p_len, c_len, prompt_width=6, completion_width=10,
                               groups=1).src.shape[0])
  assert len(ks) <= packing.BUCKETS and all(k % 8 == 0 for k in ks)


def _batch(b=8, p=6, t=10, seed=0):
  rng = np.random.default_rng(seed)
  p_len, c_len = _lengths(b, p, t, seed)
  pm = (np.arange(p)[None] >= p - p_len[:, None]).astype(np.int32)
  cm = (np.arange(t)[None] < c_len[:, None]).astype(np.int32)
  batch = {"prompt_tokens": (rng.integers(3, 97, (b, p)) * pm).astype(np.int32),
           "prompt_mask": pm, "tokens": rng.integers(3, 97, (b, t)).astype(np.int32),
           "mask": cm, "old_logp": np.log(rng.uniform(0.01, 0.2, (b, t))).astype(np.float32) * cm,
           "ref_logp": np.zeros((b, t), np.float32),
           "advantages": (rng.normal(size=b)[:, None] * cm).astype(np.float32),
           "returns": np.zeros((b, t), np.float32), "old_values": np.zeros((b, t), np.float32),
           "token_weights": np.ones((b, t), np.float32), "is_weights": np.ones((b, t), np.float32),
           "rng": np.asarray(jax.random.key_data(jax.random.split(jax.random.key(seed), b))),
           "kl_coef": np.float32(0.0)}
  return batch, p_len, c_len


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum",
                                 "seq_mean_token_sum_norm"])
@pytest.mark.parametrize("ratio_level", ["token", "sequence", "sequence_token"])
def test_packed_loss_and_gradients_equal_padded(agg, ratio_level, tmp_path):
  config = micro_config("grpo", tmp_path, **{"algo.loss_agg": agg,
                                             "algo.ratio_level": ratio_level})
  model = perturb_params(Decoder(tiny_config(), rngs=nnx.Rngs(0)), scale=0.2)
  graphdef, params = nnx.split(model)
  batch, p_len, c_len = _batch()
  layout = packing.pack_layout(p_len, c_len, prompt_width=6, completion_width=10, groups=2)
  packed = {**batch, **packing.layout_arrays(layout)}
  out = {}
  for groups, data in ((0, batch), (2, packed)):
    spec = loss_spec(config, groups)
    data = jax.tree.map(jnp.asarray, data)
    denom = objective.denominators(spec, data["mask"])

    def loss(params, data=data, spec=spec, denom=denom):
      return objective.micro_loss(spec, nnx.merge(graphdef, params), None, data, denom)
    (value, metrics), grads = jax.value_and_grad(loss, has_aux=True)(params)
    out[groups] = (value, metrics, grads)
  np.testing.assert_allclose(out[2][0], out[0][0], rtol=1e-5, atol=1e-7)
  for key in ("entropy", "clip_high", "ratio", "approx_kl_old"):
    np.testing.assert_allclose(out[2][1][key], out[0][1][key], rtol=1e-5, atol=1e-6, err_msg=key)
  # packed vs padded forward and backward: other attention sums; the bound scales with the
  # largest gradient (some leaves are ~0 up to rounding)
  g_max = max(float(jnp.abs(g).max()) for g in jax.tree.leaves(out[0][2]))
  for a, b in zip(jax.tree.leaves(out[0][2]), jax.tree.leaves(out[2][2])):
    assert_close_f32(b, a, ulps=256, scale=g_max)
  assert max(float(jnp.abs(g).max()) for g in jax.tree.leaves(out[0][2])) > 1e-4


def test_trainer_packed_equals_padded_on_one_and_eight_devices(tmp_path):
  runs = {}
  for pack in (False, True):
    for devices in (1, 8):
      config = micro_config("grpo", tmp_path / f"{pack}{devices}", **{
          **SIGNAL, "algo.pack_sequences": pack, "parallel.num_devices": devices})
      train(config)
      runs[pack, devices] = read_records(tmp_path / f"{pack}{devices}" / "grpo")
  base = runs[False, 1]
  assert base[0]["update/grad_norm"] > 0
  for key, recs in runs.items():
    for one, other in zip(base, recs):
      assert one["train/raw_score"] == other["train/raw_score"], key
      for m in ("update/loss", "update/grad_norm", "update/entropy", "train/entropy_rollout"):
        # a loss near 0 (a mean of O(1) terms) keeps the terms' rounding: 64 eps32 of 1
        np.testing.assert_allclose(other[m], one[m], rtol=5e-5, atol=f32_atol(1.0, ulps=64),
                                   err_msg=f"{key} {m}")
