"""Rejection-sampling fine-tuning phases (Llama 2, arXiv:2307.09288, Sec. 3.2.3): the SFT
batch holds exactly the best completion of each group, a phase raises their likelihood,
nothing is trained when nothing passes min_score, and runs with phases on stay
compile-stable and resume exactly."""

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx
from test_train_resume import _final_params, _records
from train_micro import micro_config, read_records

from rljax.data.rejection import best_of_k
from rljax.rewards.base import compose
from rljax.train.config import ConfigError, apply_overrides, base_config, validate
from rljax.train.loop import train
from rljax.train.run.build import build
from rljax.train.run.rejection_sft import RejectionSFT
from rljax.train.update import objective

K, PROMPTS = 4, 6
RSFT = {"algo.rsft_every": 2, "algo.rsft_k": K, "algo.rsft_prompts": PROMPTS,
        "algo.rsft_steps": 3, "algo.rsft_lr": 3e-3}


def _digits(prompt, completion):
  del prompt
  return float(sum(ch.isdigit() for ch in completion))


@pytest.fixture(scope="module")
def phase_setup(tmp_path_factory):
  """A micro setup whose reward counts digits (varied scores even for a random policy)."""
  config = micro_config("grpo", tmp_path_factory.mktemp("rsft_unit"), **RSFT)
  run = build(config)
  reward = compose([("accuracy", _digits, 1.0), ("format", lambda p, c: 0.0, 0.0)],
                   timeout=None)
  run.rollouts = run.rollouts.with_context(run.ctx.replace(reward_fn=reward))
  state = run.params.init_state(run.params.initial_actor)
  return run, state


def _phase(run, **changes):
  spec = dataclasses.replace(run.specs.schedule.rsft, **changes)
  return RejectionSFT(spec, rollouts=run.rollouts, task=run.task,
                      graphdef=run.params.actor_graphdef, mesh=run.mesh, seed=run.specs.run.seed)


def _mean_logp(run, params, batch, rows):
  """Mean per-token log-likelihood of `rows` of `batch` under `params`."""
  sub = {k: np.asarray(v)[rows] for k, v in batch.items()}
  nll, count = objective.sft_nll(nnx.merge(run.params.actor_graphdef, params), sub)
  return -float(nll) / float(count)


def test_phase_trains_on_exactly_the_best_of_each_group(phase_setup):
  setup, state = phase_setup
  model = nnx.merge(setup.params.actor_graphdef, state.actor)
  probe = _phase(setup).phase(state, 0, model)
  scores_bg = np.asarray(probe.rows["scores"]).reshape(PROMPTS, K)
  assert scores_bg.std() > 0                          # the reward really distinguishes samples
  # Keep only groups whose best beats the median best: some kept, some dropped (padding).
  threshold = float(np.median(scores_bg.max(axis=1))) + 0.5
  out = _phase(setup, rsft_min_score=threshold).phase(state, 0, model)
  scores = np.asarray(out.rows["scores"])
  expected = best_of_k(scores, out.rows["group_id"], min_score=threshold)
  np.testing.assert_array_equal(out.kept, expected)
  # Independent of best_of_k: groups whose max >= threshold, and their first argmax.
  groups = [g for g in range(PROMPTS) if scores_bg[g].max() >= threshold]
  assert 0 < len(groups) < PROMPTS
  np.testing.assert_array_equal(out.kept, [g * K + int(np.argmax(scores_bg[g])) for g in groups])
  g = len(groups)
  for key in ("prompt_tokens", "prompt_mask", "tokens", "mask"):
    assert out.batch[key].shape[0] == PROMPTS
    np.testing.assert_array_equal(out.batch[key][:g], np.asarray(out.rows[key])[out.kept])
  assert out.batch["mask"][g:].sum() == 0           # padding rows carry no loss
  assert out.metrics["rsft/kept_frac"] == pytest.approx(g / PROMPTS)
  assert out.metrics["rsft/best_score_mean"] == pytest.approx(scores_bg.max(axis=1).mean())
  assert out.metrics["rsft/kept_score_mean"] >= out.metrics["rsft/score_mean"]

  kept_rows = np.arange(g)
  before = _mean_logp(setup, state.actor, out.batch, kept_rows)
  after = _mean_logp(setup, out.state.actor, out.batch, kept_rows)
  assert after > before + 1e-3, (before, after)
  assert out.metrics["rsft/loss_before"] == pytest.approx(-before, rel=1e-4)
  assert out.metrics["rsft/loss_after"] == pytest.approx(-after, rel=1e-4)
  assert out.state.actor_opt is state.actor_opt      # the RL optimizer state is not touched


def test_nothing_kept_means_nothing_trained(phase_setup):
  setup, state = phase_setup
  # min_score above every possible digit count
  out = _phase(setup, rsft_min_score=1e9).phase(state, 1,
                                           nnx.merge(setup.params.actor_graphdef, state.actor))
  assert len(out.kept) == 0 and out.batch["mask"].sum() == 0
  assert out.metrics["rsft/kept_frac"] == 0.0 and out.metrics["rsft/steps"] == 0
  jax.tree.map(np.testing.assert_array_equal, out.state.actor, state.actor)


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
  base = tmp_path_factory.mktemp("rsft_runs")
  config = micro_config("grpo", base / "ref", **dict(RSFT, **{"run.iterations": 3}))
  train(config)
  return base, base / "ref" / "grpo"


def test_run_writes_rsft_metrics_on_phase_iterations_without_recompiling(reference_run):
  _, run_dir = reference_run
  records = read_records(run_dir)
  # Phases run before iterations 0 and 2 (records 1 and 3), none before iteration 1.
  assert [("rsft/kept_frac" in r) for r in records] == [True, False, True]
  for r in (records[0], records[2]):
    assert r["rsft/steps"] == RSFT["algo.rsft_steps"] and r["time/rsft_s"] > 0
    assert r["rsft/loss_after"] < r["rsft/loss_before"]
    assert r["rsft/best_score_mean"] >= r["rsft/score_mean"]
  counts = [r["compile/programs"] for r in records]
  assert counts[0] > 0 and counts == [counts[0]] * 3, counts


def test_resume_with_phases_equals_uninterrupted_run(reference_run):
  base, ref_dir = reference_run
  overrides = dict(RSFT, **{"run.iterations": 3})
  train(micro_config("grpo", base / "resumed", **overrides), stop_after=1)
  run_dir = base / "resumed" / "grpo"
  assert len(read_records(run_dir)) == 1
  result = train(micro_config("grpo", base / "resumed", **overrides))
  assert result["iterations"] == 3
  assert _records(run_dir) == _records(ref_dir)
  jax.tree.map(np.testing.assert_array_equal, _final_params(run_dir, 3),
               _final_params(ref_dir, 3))


@pytest.mark.parametrize("fields,needle", [
    ({"algo.rsft_every": -1}, "algo.rsft_every"),
    ({"algo.rsft_every": 2, "algo.rsft_k": 0}, "algo.rsft_k"),
    ({"algo.rsft_every": 2, "algo.rsft_prompts": 0}, "algo.rsft_prompts"),
    ({"algo.rsft_every": 2, "algo.rsft_steps": 0}, "algo.rsft_steps"),
    ({"algo.rsft_every": 2, "algo.rsft_lr": 0.0}, "algo.rsft_lr"),
    ({"algo.rsft_every": 2, "algo.rsft_min_score": "high"}, "algo.rsft_min_score"),
])
def test_invalid_rsft_fields_are_named(fields, needle):
  c = base_config()
  apply_overrides(c, fields)
  with pytest.raises(ConfigError, match=needle):
    validate(c, num_devices=1)
  apply_overrides(c, {"algo.rsft_every": 0})            # off: the other fields are not read
  if "algo.rsft_every" not in fields:
    validate(c, num_devices=1)
