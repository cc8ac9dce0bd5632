"""End-to-end: every experiment file runs two RL iterations on a micro configuration;
1 device vs 8 simulated devices; micro-batch split; no recompilation after iteration 1."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tolerances import f32_atol
from train_micro import built, micro_config, read_records, restored_state

from rljax.train.loop import train

EXPERIMENT_SPECS = [
    "grpo", "dr_grpo", "gspo", "gspo:token", "cispo", "cispo:absolute_cap", "rloo", "remax",
    "reinforce_pp", "reinforce_pp:baseline", "ppo", "ppo:ptx", "psr_nsr", "entropy:bonus",
    "entropy:high_entropy_mask", "entropy:clip_cov", "entropy:kl_cov", "dapo:token_level_loss",
    "grpo:all_scratchpad", "rl_vs_sft:continued_sft", "rl_vs_sft:rejection_sft",
    "sapo", "gmpo", "lite_ppo", "gpg", "dppo", "dppo:kl", "user_task", "lora:r8",
]


@pytest.mark.slow
@pytest.mark.parametrize("spec", EXPERIMENT_SPECS)
def test_experiment_runs_two_iterations(spec, tmp_path):
  config = micro_config(spec, tmp_path)
  result = train(config)
  assert result["iterations"] == 2
  records = read_records(tmp_path / spec.replace(":", "_"))
  assert [r["iteration"] for r in records] == [1, 2]
  for r in records:
    assert np.isfinite(r["update/loss"]) and r["update/skipped"] == 0
    assert 0 <= r["train/accuracy"] <= 1
  if config.algo.advantage == "gae":
    assert "update/value_loss" in records[-1] and "critic/explained_variance" in records[-1]
  if config.algo.kl_placement != "none":
    assert "kl/to_ref" in records[-1]
  assert 0.0 <= result["heldout_acc_after"] <= 1.0
  if config.task.ood_difficulty:
    assert 0.0 <= result["heldout_ood_accuracy"] <= 1.0
    assert "heldout_ood_accuracy_before" in result


def test_dapo_dynamic_sampling_refills_groups(tmp_path, monkeypatch):
  """The full DAPO step with a reward whose accuracy varies within groups: every kept group
  has non-zero accuracy variance, so no update sees a zero-advantage group."""
  from rljax.data import tasks

  def coin_score(self, prompt, completion):
    acc = float(hash((prompt.id, completion)) % 3 == 0)
    return tasks.RewardBreakdown(total=acc, accuracy=acc, format=0.0)

  monkeypatch.setattr(tasks.Task, "score", coin_score)
  config = micro_config("dapo", tmp_path, **{"algo.dynamic_sampling_max_rounds": 20})
  train(config)
  for r in read_records(tmp_path / "dapo"):
    assert r["train/generation_rounds"] >= 1
    assert r["train/zero_variance_group_frac"] >= 0
    assert 0 < r["train/accuracy"] < 1


def test_dynamic_sampling_gives_up_with_a_clear_error(tmp_path):
  """An untrained micro model never solves a task: every group has zero variance."""
  from rljax.data.buffer import DynamicSamplingError

  config = micro_config("dapo", tmp_path, **{"algo.dynamic_sampling_max_rounds": 2})
  with pytest.raises(DynamicSamplingError, match="algo.dynamic_sampling_max_rounds"):
    train(config)


def test_no_recompilation_after_first_iteration(tmp_path):
  config = micro_config("grpo", tmp_path, **{"run.iterations": 4})
  train(config)
  counts = [r["compile/programs"] for r in read_records(tmp_path / "grpo")]
  assert counts[0] > 0 and counts == [counts[0]] * 4, counts


def test_eight_devices_give_the_same_losses_as_one(tmp_path):
  """Same seed, same rollouts; only the mesh differs. Tolerance: 2e-5 relative, 64 eps32
  absolute (fp32 sums are reduced in a different order across devices)."""
  assert jax.device_count() == 8
  runs = {}
  for devices in (1, 8):
    # a reward that varies with the text: the untrained model's verifier reward is 0 and
    # so would be every loss and gradient
    config = micro_config("grpo", tmp_path / f"d{devices}", **{
        "parallel.num_devices": devices,
        "task.reward_fns": ["tests/signal_rewards.py:digit_share"]})
    train(config)
    runs[devices] = read_records(tmp_path / f"d{devices}" / "grpo")
  assert runs[1][0]["update/grad_norm"] > 0
  for one, eight in zip(runs[1], runs[8]):
    assert one["train/raw_score"] == eight["train/raw_score"]
    assert one["train/response_length_mean"] == eight["train/response_length_mean"]
    for key in ("update/loss", "update/pg_loss", "update/grad_norm", "update/entropy"):
      # a loss is a mean of O(1) terms (normalised advantage x ratio) that can cancel to ~0:
      # there its rounding is still that of the terms, 64 eps32 of 1
      np.testing.assert_allclose(eight[key], one[key], rtol=2e-5, atol=f32_atol(1.0, ulps=64),
                                 err_msg=key)


def test_old_logp_from_the_update_equals_recomputing_it(tmp_path):
  """old_logp_source='update' skips a forward pass; losses, rollout statistics and the
  trained parameters equal the recomputed path (one update per rollout)."""
  runs, params = {}, {}
  for source in ("recompute", "update"):
    config = micro_config("grpo", tmp_path / source, **{
        "algo.old_logp_source": source, "algo.minibatches": 1, "algo.epochs": 1,
        "run.iterations": 3})
    train(config)
    runs[source] = read_records(tmp_path / source / "grpo")
    params[source] = _final_actor(tmp_path / source / "grpo", config)
  for rec, upd in zip(runs["recompute"], runs["update"]):
    assert rec.keys() == upd.keys()
    assert rec["train/raw_score"] == upd["train/raw_score"]      # same rollouts
    for key in ("update/loss", "update/grad_norm", "update/entropy", "update/ratio",
                "train/entropy_rollout", "mismatch/logp_gap_mean", "tokens/entropy_p50"):
      # loss and log-prob gap: means of O(1) terms near 0, bounded by the terms' rounding
      np.testing.assert_allclose(upd[key], rec[key], rtol=1e-4, atol=f32_atol(1.0, ulps=64),
                                 err_msg=key)
  assert runs["update"][-1]["compile/programs"] == runs["update"][0]["compile/programs"]
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
               params["recompute"], params["update"])


def _final_actor(run_dir, config):
  return jax.tree.map(np.asarray, restored_state(run_dir, config).actor)


def _synthetic_minibatch(setup, rng, b):
  t, p = setup.specs.rollout.max_new_tokens, setup.ctx.prompt_len
  lengths = rng.integers(1, t + 1, size=b)
  mask = (np.arange(t)[None] < lengths[:, None]).astype(np.int32)
  prompt_mask = np.ones((b, p), np.int32)
  prompt_mask[: b // 2, : p // 2] = 0
  v = setup.model_cfg.vocab_size
  return {
      "prompt_tokens": rng.integers(3, v, (b, p)).astype(np.int32), "prompt_mask": prompt_mask,
      "tokens": rng.integers(3, v, (b, t)).astype(np.int32), "mask": mask,
      "old_logp": (-rng.random((b, t)) * 3).astype(np.float32),
      "ref_logp": (-rng.random((b, t)) * 3).astype(np.float32),
      "advantages": rng.normal(size=(b, t)).astype(np.float32),
      "returns": rng.normal(size=(b, t)).astype(np.float32),
      "old_values": rng.normal(size=(b, t)).astype(np.float32),
      "token_weights": np.ones((b, t), np.float32), "is_weights": np.ones((b, t), np.float32),
      "rng": np.asarray(jax.random.key_data(jax.random.split(jax.random.key(0), b))),
      "kl_coef": np.float32(0.1),
  }


@pytest.mark.parametrize("spec,agg", [("grpo", "seq_mean_token_mean"), ("dapo", "token_mean"),
                                      ("dr_grpo", "seq_mean_token_sum_norm"), ("ppo", "token_mean")])
def test_microbatch_split_does_not_change_the_update(spec, agg, tmp_path):
  """Loss, gradient norm and new parameters agree for 1 and 4 micro-batches (fp32, 1e-5)."""
  outs = []
  for micro in (1, 4):
    config = micro_config(spec, tmp_path, **{"algo.microbatches": micro, "algo.loss_agg": agg,
                                             "algo.minibatches": 1, "parallel.num_devices": 1})
    s, state, trainer = built(config)
    batch = _synthetic_minibatch(s, np.random.default_rng(0), 16)
    new_state, metrics = trainer.update_step(state, batch, jnp.asarray(True))
    outs.append((metrics, jax.tree.map(np.asarray, new_state.actor)))
  (m1, p1), (m4, p4) = outs
  for key in ("loss", "pg_loss", "grad_norm"):
    # a loss is a mean of O(1) terms that can cancel to ~0: the terms' rounding bounds it there
    np.testing.assert_allclose(m4[key], m1[key], rtol=1e-5, atol=f32_atol(1.0, ulps=64),
                               err_msg=key)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), p1, p4)


def test_eval_command_restores_the_latest_checkpoint(tmp_path):
  from rljax.train.run.heldout import evaluate_run

  config = micro_config("grpo", tmp_path, **{"run.iterations": 1})
  result = train(config)
  again = evaluate_run(tmp_path / "grpo")
  assert again["accuracy"] == result["heldout_acc_after"]
  assert set(again) >= {"accuracy", "avg@2", "pass@1", "pass@2"}
