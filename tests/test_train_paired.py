"""Paired arms: common random numbers in the sampler and the trainer, the ablation's report
and its reuse of compiled programs."""

import json

import jax
import numpy as np
from flax import nnx
from train_micro import micro_config, read_records

from rljax.models import Decoder
from rljax.models.testing import perturb_params, tiny_config
from rljax.sampling import SamplingParams, generate
from rljax.sampling.continuous import generate_continuous
from rljax.train.ablate.runner import run_ablation
from rljax.train.loop import train
from rljax.train.run.build import build

VOLATILE = ("time/", "compile/", "env/seconds")


def _model():
  return perturb_params(Decoder(tiny_config(), rngs=nnx.Rngs(0)), scale=0.3)


def _prompts(rows):
  rng = np.random.default_rng(0)
  tokens = rng.integers(3, 97, (rows, 6)).astype(np.int32)
  return tokens, np.ones_like(tokens)


def test_sample_j_of_a_prompt_draws_the_same_numbers_whatever_n_and_the_batch():
  """Streams (prompt, sample index): prompt b's sample j is the same in a batch of n = 2 and
  of n = 5, and in another batch order, in the static and the continuous sampler."""
  model, key = _model(), jax.random.key(3)
  tokens, mask = _prompts(3)
  sp = SamplingParams(max_new_tokens=10, stop_tokens=(5,))
  two = generate(model, tokens, mask, sampling=sp.replace(n=2), rng=key)
  five = generate(model, tokens, mask, sampling=sp.replace(n=5), rng=key)
  for b in range(3):
    np.testing.assert_array_equal(np.asarray(five.tokens)[5 * b:5 * b + 2],
                                  np.asarray(two.tokens)[2 * b:2 * b + 2])
  order = [2, 0, 1]
  streams = np.stack([np.repeat(order, 2), np.tile([0, 1], 3)], axis=1)
  shuffled = generate(model, tokens[order], mask[order], sampling=sp.replace(n=2), rng=key,
                      streams=streams)
  for i, b in enumerate(order):
    np.testing.assert_array_equal(np.asarray(shuffled.tokens)[2 * i:2 * i + 2],
                                  np.asarray(two.tokens)[2 * b:2 * b + 2])
  cont = generate_continuous(model, tokens, mask, sampling=sp.replace(n=5), rng=key, slots=4)
  np.testing.assert_array_equal(np.asarray(cont.tokens), np.asarray(five.tokens))
  assert not np.array_equal(np.asarray(five.tokens)[0], np.asarray(five.tokens)[1])


def _comparable(run_dir):
  records = [{k: v for k, v in r.items() if not k.startswith(VOLATILE)}
             for r in read_records(run_dir)]
  result = {k: v for k, v in json.loads((run_dir / "result.json").read_text()).items()
            if k != "wall_s"}
  return records, result


def test_arms_with_the_same_or_a_no_op_setting_are_bitwise_identical(tmp_path):
  """Common random numbers in the trainer: the same config twice, and a config that changes
  only a setting the run does not use (Clip-Cov's ratio under the PPO loss), give identical
  metrics and results."""
  base = {"task.reward_fns": ["tests/signal_rewards.py:digit_share"], "parallel.num_devices": 1}
  runs = {}
  for name, extra in (("a", {}), ("b", {}), ("noop", {"algo.clip_cov_ratio": 0.5})):
    train(micro_config("grpo", tmp_path / name, **base, **extra))
    runs[name] = _comparable(tmp_path / name / "grpo")
  assert runs["a"][0][0]["update/grad_norm"] > 0
  assert runs["a"] == runs["b"] == runs["noop"]


def test_dynamic_sampling_rounds_do_not_shift_the_next_iterations_prompts(tmp_path):
  """Round 0 of every iteration draws the same prompts in every arm; extra dynamic-sampling
  rounds come from (seed, iteration, round) alone."""
  drawn = {}
  for arm, extra_rounds in (("plain", 0), ("dynamic", 3)):
    run = build(micro_config("grpo", tmp_path / arm))
    firsts = []
    for it in range(3):
      draw = run.batches.draw_prompts(it)
      firsts.append([p.id for p in draw(4, 0)])
      for r in range(1, extra_rounds + 1):
        draw(4, r)
    drawn[arm] = firsts
  assert drawn["plain"] == drawn["dynamic"]
  assert drawn["plain"][0] != drawn["plain"][1]


def test_ablation_report_schema_a_a_control_compile_reuse_and_finished_runs(tmp_path,
                                                                           monkeypatch):
  """A 2-step (a step and its A/A copy, `aa=True`), 3-seed, 2-iteration ablation: the copy's
  first rollout differs from the original's on every seed (its own sampling noise), the
  report has the documented schema, the A/A effect's interval covers 0, the runs after the
  first compile nothing the first did not (a count of persistent-cache misses), and running
  it again trains nothing: it reads the finished runs and rebuilds the same effects."""
  from rljax.train.ablate import runner

  sets = [f"{k}={v}" for k, v in {
      "run.iterations": 2, "model.hidden_size": 32, "model.intermediate_size": 64,
      "model.num_layers": 1, "model.num_heads": 2, "model.num_kv_heads": 1, "model.head_dim": 16,
      "sft.steps": 0, "sampling.prompts_per_iteration": 4, "sampling.n": 4,
      "sampling.max_new_tokens": 16, "task.heldout_size": 16, "sampling.eval_n": 2,
      "sampling.eval_passk_n": 4, "sampling.eval_passk_prompts": 8, "algo.minibatches": 2,
      "algo.overlong_cache_len": 4, "run.progress": False,
      "task.reward_fns": '["tests/signal_rewards.py:digit_share"]'}.items()]
  options = dict(out_dir=tmp_path / "ab", overrides=sets, seeds=[0, 1, 2],
                 steps=["naive_grpo"], aa=True)
  path = run_ablation("experiments/dapo.py", **options)
  report = json.loads((tmp_path / "ab" / "report.json").read_text())
  assert path.exists() and (tmp_path / "ab" / "effects.png").exists()
  assert [s["name"] for s in report["steps"]] == ["naive_grpo", "naive_grpo@aa"]
  assert report["provenance"]["jax"] == jax.__version__
  assert report["provenance"]["commit"] and report["provenance"]["cpu"]
  for seed in range(3):
    first = [read_records(tmp_path / "ab" / step / f"seed{seed}")[0]
             for step in ("naive_grpo", "naive_grpo@aa")]
    keys = ("train/sampled_score", "train/response_length_mean", "train/entropy_rollout")
    assert [first[0][k] for k in keys] != [first[1][k] for k in keys], seed
  first, aa = report["steps"]
  assert first["seeds"] == aa["seeds"] == [0, 1, 2]
  assert first["effects_vs_previous"] == {} and first["effects_vs_first"] == {}
  for outcome in ("heldout_avg@2", "heldout_pass@4", "heldout_accuracy", "train_reward_auc"):
    effect = aa["effects_vs_previous"][outcome]
    assert set(effect) >= {"mean", "ci_low", "ci_high", "verdict"}
    assert effect["ci_low"] <= 0 <= effect["ci_high"], outcome
    assert effect["verdict"] not in ("better", "worse"), outcome
    assert effect["family"] == "exploratory" and effect["p_adjusted"] == effect["p"]
  for outcome, effect in aa["effects_vs_first"].items():   # vs first = vs its original here
    assert effect["mean"] == aa["effects_vs_previous"][outcome]["mean"], outcome
  assert report["primary"]["outcome"] == "heldout_avg@2" and report["primary"]["steps"] == []
  later = report["compile"]["runs"][1:]
  assert sum(r["cache_misses"] for r in later) == 0 and sum(r["cache_hits"] for r in later) > 0

  def no_training(config):
    raise AssertionError(f"trained {config.run.dir} again")

  monkeypatch.setattr(runner, "train_validated", no_training)
  run_ablation("experiments/dapo.py", **options, report_only=True)
  again = json.loads((tmp_path / "ab" / "report.json").read_text())
  assert again["runs_reused"] == 6 and "rebuild_s" in again
  assert again["compile"] == report["compile"] and again["wall_s"] == report["wall_s"]
  assert again["steps"] == report["steps"]
