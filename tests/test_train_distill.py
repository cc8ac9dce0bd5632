"""On-policy distillation in the trainer: the teacher is loaded from an rljax run directory
(any width and depth, the student's tokenizer), scores the sampled tokens, stays frozen
outside the TrainState, and its term is 0 when it equals the student."""

import jax
import numpy as np
import pytest
from train_micro import built, micro_config, read_records

from rljax.models import save_hf
from rljax.ops.shaping import RunningMoments
from rljax.train.config import ConfigError
from rljax.train.config.specs import distill_spec
from rljax.train.loop import train
from rljax.train.params import Checkpointer
from rljax.train.rollout import collect
from rljax.train.rollout.train_batches import sample_now
from rljax.train.run.build import build
from rljax.train.run.iteration import rl_iteration
from rljax.train.run.loop import train_teacher_if_absent
from rljax.train.run.rejection_sft import RejectionSFT, phase_key, phase_prompts

# a teacher wider and deeper than the micro student (32 wide, 1 layer)
WIDER = {"model.hidden_size": 48, "model.intermediate_size": 96, "model.num_layers": 2}


def teacher_run(tmp_path, name, **overrides):
  """An rljax run directory holding a checkpoint of a freshly initialised policy (no SFT,
  no RL): its config.json and checkpoints/1. Returns (directory, that policy's params)."""
  config = micro_config("grpo", tmp_path, **{"run.dir": str(tmp_path / name), **overrides})
  run, state, _ = built(config)
  ckpt = Checkpointer(config.run.dir, keep=1)
  try:
    run.params.save(ckpt, 1, state, {"teacher": name})
  finally:
    ckpt.close()
  (tmp_path / name / "config.json").write_text(run.config_json)
  return str(tmp_path / name), state.actor


def _leaves(tree):
  return [np.asarray(x) for x in jax.tree.leaves(tree)]


def test_teacher_equal_to_the_student_gives_a_zero_term(tmp_path):
  """Same architecture, seed and parameters: log π_s − log π_t = 0 on every token, so the
  distillation advantage (alone, distill_only) is 0 everywhere."""
  teacher_dir, _ = teacher_run(tmp_path, "twin")
  config = micro_config("grpo", tmp_path, **{"algo.distill_teacher": teacher_dir,
                                             "algo.distill_only": True})
  run, state, trainer = built(config)
  key = jax.random.key(3)
  batch, _ = collect(run.rollouts, run.params.model(state), run.batches.draw_prompts(0),
                     lambda round_: key, run.specs.rollout)
  upd, metrics, _ = trainer.preparer.prepare(state, batch, key, RunningMoments.create())
  assert metrics["distill/reverse_kl"] == 0.0
  assert metrics["distill/teacher_logp"] < 0.0
  np.testing.assert_array_equal(np.asarray(upd.advantages), 0.0)
  np.testing.assert_array_equal(np.asarray(upd.teacher_logp), np.asarray(upd.old_logp))


def test_teacher_stays_frozen_outside_the_train_state(tmp_path):
  """A wider, deeper teacher: restored from its checkpoint, placed on the mesh, unchanged
  by an RL iteration that moves the student, and absent from the state and its optimizer."""
  teacher_dir, saved = teacher_run(tmp_path, "wide", **WIDER)
  config = micro_config("grpo", tmp_path, **{"algo.distill_teacher": teacher_dir})
  run, state, trainer = built(config)
  teacher = run.params.teacher
  for got, want in zip(_leaves(teacher.params), _leaves(saved)):
    np.testing.assert_array_equal(got, want)
  assert all(x.sharding.mesh == run.mesh for x in jax.tree.leaves(teacher.params))
  # the state of the same run without a teacher has the same structure and shapes
  _, plain, _ = built(micro_config("grpo", tmp_path / "plain"))
  assert jax.tree.structure(state) == jax.tree.structure(plain)
  assert [x.shape for x in jax.tree.leaves(state)] == [x.shape for x in jax.tree.leaves(plain)]
  teacher_shapes = {x.shape for x in jax.tree.leaves(teacher.params)} - {
      x.shape for x in jax.tree.leaves(plain.actor)}
  assert teacher_shapes and not teacher_shapes & {x.shape for x in jax.tree.leaves(state)}

  before_student = _leaves(state.actor)
  sampled = sample_now(run.batches, state.rng, 0, run.params.model(state))
  state, metrics, _, _ = rl_iteration(trainer, state, 0, RunningMoments.create(), sampled)
  assert np.isfinite(metrics["distill/reverse_kl"]) and metrics["update/skipped"] == 0
  assert any(np.any(a != b) for a, b in zip(_leaves(state.actor), before_student))
  for got, want in zip(_leaves(run.params.teacher.params), _leaves(saved)):
    np.testing.assert_array_equal(got, want)


@pytest.mark.slow
def test_micro_run_with_a_teacher_trains_and_logs_the_metrics(tmp_path):
  teacher_dir, _ = teacher_run(tmp_path, "wide", **WIDER)
  config = micro_config("grpo", tmp_path, **{"algo.distill_teacher": teacher_dir,
                                             "algo.distill_mode": "reward",
                                             "algo.distill_coef": 0.5,
                                             "algo.distill_teacher_dtype": "bfloat16"})
  result = train(config)
  assert result["iterations"] == 2
  records = read_records(tmp_path / "grpo")
  for r in records:
    assert np.isfinite(r["distill/reverse_kl"]) and r["distill/teacher_logp"] < 0
    assert np.isfinite(r["update/loss"]) and r["update/skipped"] == 0


def _same_logits(teacher, model, run):
  """The teacher module and `model` give the same logits on a few prompt tokens."""
  tokens = jax.numpy.asarray(run.tokenizer.encode("1+2=3"))[None]
  positions = jax.numpy.arange(tokens.shape[1])[None]
  attention = jax.numpy.ones_like(tokens)
  got = teacher.model()(tokens, positions=positions, attention_mask=attention)
  want = model(tokens, positions=positions, attention_mask=attention)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


def test_a_lora_run_and_a_hugging_face_directory_are_teachers(tmp_path):
  """A LoRA run's teacher is its base (lora_base/) with its adapters (the checkpoint); a
  local Hugging Face directory (no tokenizer files: same model vocabulary) loads as is."""
  config = micro_config("grpo", tmp_path, **{"run.dir": str(tmp_path / "lora"),
                                             "model.lora_rank": 4})
  run, state, _ = built(config)
  state = state._replace(actor=jax.tree.map(lambda x: x + 0.01, state.actor))  # adapters != 0
  ckpt = Checkpointer(config.run.dir, keep=1)
  try:
    run.params.save_frozen(ckpt, state)
    run.params.save(ckpt, 1, state, {})
  finally:
    ckpt.close()
  (tmp_path / "lora" / "config.json").write_text(run.config_json)
  student = micro_config("grpo", tmp_path, **{"algo.distill_teacher": str(tmp_path / "lora")})
  teacher = build(student).params.teacher
  _same_logits(teacher, run.params.model(state), run)

  plain, plain_state, _ = built(micro_config("grpo", tmp_path / "plain"))
  save_hf(plain.params.model(plain_state), plain.model_cfg, str(tmp_path / "hf"))
  student = micro_config("grpo", tmp_path, **{"algo.distill_teacher": str(tmp_path / "hf")})
  _same_logits(build(student).params.teacher, plain.params.model(plain_state), plain)


def test_a_teacher_with_another_tokenizer_is_refused(tmp_path):
  """The calculator task adds tags to the character tokenizer: other ids, other tokens."""
  teacher_dir, _ = teacher_run(tmp_path, "calc", **{"task.name": "calculator"})
  config = micro_config("grpo", tmp_path, **{"algo.distill_teacher": teacher_dir})
  with pytest.raises(ConfigError, match=r"algo.distill_teacher=.*vocabulary"):
    build(config)


@pytest.mark.parametrize("overrides, field", [
    ({"algo.distill_only": True}, "algo.distill_only"),
    ({"algo.distill_teacher": "runs/none{seed}"}, "algo.distill_teacher='runs/none{seed}'"),
    ({"algo.distill_teacher": "x", "algo.distill_teacher_recipe": "nope.py"},
     "algo.distill_teacher_recipe"),
    ({"algo.distill_mode": "forward"}, "algo.distill_mode"),
    ({"algo.distill_coef": -1.0}, "algo.distill_coef"),
    ({"algo.rsft_from_teacher": True}, "algo.rsft_from_teacher"),
])
def test_invalid_distillation_fields_are_named(tmp_path, overrides, field):
  with pytest.raises(ConfigError, match=field.replace("{", r"\{").replace("}", r"\}")):
    micro_config("grpo", tmp_path, **overrides)


def test_recipe_trains_the_teacher_once_per_seed(tmp_path):
  """With a recipe, a missing teacher is trained (the recipe's config, this run's seed, the
  teacher directory as run.dir); a finished one (result.json) is reused."""
  config = micro_config("grpo", tmp_path, **{
      "algo.distill_teacher": str(tmp_path / "teacher" / "seed{seed}"), "run.seed": 3,
      "algo.distill_teacher_recipe": "experiments/grpo.py:all_scratchpad"})
  spec = distill_spec(config)
  assert spec.distill_teacher == str(tmp_path / "teacher" / "seed3")
  calls = []
  train_teacher_if_absent(spec, lambda c: calls.append((c.run.dir, c.run.seed, c.algo.epochs)))
  assert calls == [(spec.distill_teacher, 3, 1)]   # all_scratchpad: one epoch
  (tmp_path / "teacher" / "seed3").mkdir(parents=True)
  (tmp_path / "teacher" / "seed3" / "result.json").write_text("{}")
  train_teacher_if_absent(spec, lambda c: calls.append(c))
  assert len(calls) == 1


def test_sft_on_teacher_samples_from_the_teacher(tmp_path):
  """experiments/distill.py:sft_on_teacher: the RS-FT phase's rows are the teacher's samples
  (the same tokens as sampling the teacher with the phase's prompts and key), all kept."""
  teacher_dir, _ = teacher_run(tmp_path, "wide", **WIDER)
  config = micro_config("distill:sft_on_teacher", tmp_path, **{
      "algo.distill_teacher": teacher_dir, "algo.distill_teacher_recipe": "",
      "algo.rsft_prompts": 8, "algo.rsft_steps": 1})
  run, state, _ = built(config)
  spec = run.specs.schedule.rsft
  assert spec.rsft_from_teacher and spec.rsft_k == 1
  rsft = RejectionSFT(spec, rollouts=run.rollouts, task=run.task,
                      graphdef=run.params.actor_graphdef, mesh=run.mesh, seed=0,
                      teacher=run.params.teacher)
  result = rsft.phase(state, 0, run.params.model(state))
  prompts = phase_prompts(run.task, spec.rsft_prompts, 0, 0)
  teacher_rows = run.rollouts.sample_and_score(run.params.teacher.model(), prompts,
                                               phase_key(state, 0), sampling=rsft.sampling)
  np.testing.assert_array_equal(np.asarray(result.rows["tokens"]),
                                np.asarray(teacher_rows.tokens))
  assert result.metrics["rsft/kept_frac"] == 1.0 and result.metrics["rsft/steps"] == 1
