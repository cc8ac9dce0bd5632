"""Config loading, overrides and validation: every bad field is named."""

import ast
import itertools
import pathlib

import pytest

from rljax.train.config import (
  ConfigError,
  apply_overrides,
  base_config,
  load_config,
  parse_override_value,
  validate,
)

EXPERIMENTS = sorted(pathlib.Path(__file__).parent.parent.glob("experiments/*.py"))


def _bad(**fields):
  c = base_config()
  apply_overrides(c, fields)
  with pytest.raises(ConfigError) as err:
    validate(c, num_devices=1)
  return str(err.value)


def test_base_config_is_valid():
  validate(base_config(), num_devices=1)


@pytest.mark.parametrize("field,value,allowed", [
    ("algo.advantage", "grpoo", "'grpo'"),
    ("algo.loss_agg", "mean", "'token_mean'"),
    ("algo.policy_loss", "ppo2", "'cispo'"),
    ("algo.ratio_level", "seq", "'sequence'"),
    ("algo.kl_estimator", "k4", "'low_var_kl'"),
    ("algo.kl_placement", "both", "'reward'"),
    ("algo.is_correction", "is", "'icepop'"),
    ("task.prompt_sampler", "random", "'prioritized'"),
])
def test_unknown_choice_names_field_and_allowed_values(field, value, allowed):
  message = _bad(**{field: value})
  assert field in message and repr(value) in message and allowed in message


@pytest.mark.parametrize("fields,needle", [
    ({"algo.eps_low": 1.5}, "algo.eps_low"),
    ({"algo.eps_high": -0.1}, "algo.eps_high"),
    ({"algo.dual_clip": 0.5}, "algo.dual_clip"),
    ({"sampling.n": 1}, "sampling.n=1"),                       # group size 1 with std scaling
    ({"sampling.temperature": 0.0}, "sampling.temperature"),
    ({"sampling.top_p": 1.5}, "sampling.top_p"),
    ({"algo.minibatches": 3}, "algo.minibatches"),
    ({"algo.microbatches": 3}, "algo.microbatches"),
    ({"algo.dynamic_sampling": True, "algo.dynamic_sampling_max_rounds": 0},
     "algo.dynamic_sampling_max_rounds"),
    ({"sampling.max_new_tokens": 400}, "sampling.max_new_tokens"),   # > model positions
    ({"algo.kl_placement": "loss", "algo.kl_coef": 0.0}, "algo.kl_coef"),
    ({"algo.critic_warmup_iterations": 2}, "algo.critic_warmup_iterations"),
    ({"algo.pass_k": 9, "algo.advantage": "pass_at_k"}, "algo.pass_k"),
    ({"parallel.fsdp": 3}, "parallel"),
    ({"algo.old_logp_source": "update", "algo.epochs": 2}, "algo.epochs=2 x algo.minibatches"),
    ({"algo.old_logp_source": "update", "algo.kl_placement": "reward", "algo.kl_coef": 0.1},
     "algo.kl_placement='reward'"),
    ({"algo.old_logp_source": "update", "algo.is_correction": "tis"}, "algo.is_correction"),
    ({"task.scratchpad_fraction": 1.5}, "task.scratchpad_fraction"),
    ({"sft.worked_steps": -1}, "sft.worked_steps"),
    ({"sft.max_len": -4}, "sft.max_len"),
    ({"algo.pg_coef": 0.0}, "algo.pg_coef=0 leaves nothing to train"),
    ({"algo.pg_coef": -1.0}, "algo.pg_coef"),
    ({"task.ood_difficulty": 5, "task.name": "jsonl", "task.jsonl_path": "x.jsonl"},
     "task.ood_difficulty"),
])
def test_invalid_values_are_reported_by_name(fields, needle):
  assert needle in _bad(**fields)


def test_all_errors_are_reported_together():
  message = _bad(**{"algo.eps_low": 2.0, "algo.advantage": "x", "sampling.top_k": -1})
  assert "algo.eps_low" in message and "algo.advantage" in message and "sampling.top_k" in message


def test_batch_must_divide_over_mesh():
  c = base_config()
  apply_overrides(c, {"sampling.prompts_per_iteration": 3, "sampling.n": 2})
  with pytest.raises(ConfigError, match="data\\*fsdp"):
    validate(c, num_devices=4)


def test_unknown_override_key_fails():
  c = base_config()
  c.lock()
  with pytest.raises(KeyError, match="algo.eps_hihg"):
    apply_overrides(c, {"algo.eps_hihg": 0.3})
  with pytest.raises(KeyError, match="algoo"):
    apply_overrides(c, {"algoo.eps_high": 0.3})


def test_parse_override_value():
  assert parse_override_value("0.28") == 0.28
  assert parse_override_value("true") is True
  assert parse_override_value("grpo") == "grpo"
  assert parse_override_value("3") == 3


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.stem)
def test_every_experiment_loads_and_validates(path):
  config = load_config(str(path))
  assert config.run.dir.startswith("runs/")


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.stem)
def test_experiment_files_set_no_field_twice(path):
  """STYLE: keys set twice fail loudly. Checked statically per branch-free function body."""
  tree = ast.parse(path.read_text())
  for func in [n for n in tree.body if isinstance(n, ast.FunctionDef)]:
    seen = set()
    for node in func.body:   # top-level statements only: branches are alternatives
      targets = node.targets if isinstance(node, ast.Assign) else []
      for t in targets:
        for leaf in (t.elts if isinstance(t, ast.Tuple) else [t]):
          name = ast.unparse(leaf)
          if name.startswith("c."):
            assert name not in seen, f"{path.name}: {name} set twice"
            seen.add(name)


def test_ablation_steps_are_cumulative_for_dapo():
  steps = ("naive_grpo", "overlong_filtering", "clip_higher", "soft_overlong",
           "token_level_loss", "dynamic_sampling")
  configs = {s: load_config(f"experiments/dapo.py:{s}") for s in steps}
  assert configs["naive_grpo"].algo.eps_high == 0.2
  assert configs["clip_higher"].algo.eps_high == 0.28
  assert configs["overlong_filtering"].algo.overlong_filter
  assert configs["soft_overlong"].algo.soft_overlong and not configs["soft_overlong"].algo.overlong_filter
  assert configs["token_level_loss"].algo.loss_agg == "token_mean"
  assert configs["dynamic_sampling"].algo.dynamic_sampling
  assert configs["dynamic_sampling"].algo.eps_high == 0.28  # earlier steps stay on
  with pytest.raises(ValueError, match="naive_grpo"):
    load_config("experiments/dapo.py:nope")


def test_optimizer_warmup_schedule():
  """The first update moves the parameters unless a warm-up is asked for: with
  warmup_steps=0 the learning rate is lr from step 0 (a one-step ramp from 0 made the first
  update a no-op); with warmup_steps=4 it rises 0, lr/4, lr/2, 3lr/4, then lr."""
  import jax.numpy as jnp
  import optax

  from rljax.train.params import make_optimizer

  def first_steps(warmup, n):
    tx = make_optimizer(1.0, warmup_steps=warmup, weight_decay=0.0, b1=0.0, b2=0.0,
                        grad_clip=0.0)
    params, state, moves = jnp.zeros(()), None, []
    state = tx.init(params)
    for _ in range(n):
      updates, state = tx.update(jnp.ones(()), state, params)
      moves.append(float(-updates))
      params = optax.apply_updates(params, updates)
    return moves

  # b1 = b2 = 0: Adam's step is lr * g / (|g| + eps) ~ lr
  assert first_steps(0, 2) == pytest.approx([1.0, 1.0], rel=1e-6)
  assert first_steps(4, 6) == pytest.approx([0.0, 0.25, 0.5, 0.75, 1.0, 1.0], rel=1e-6,
                                            abs=1e-9)


def test_validation_accepts_a_mesh_exactly_when_make_mesh_builds_it():
  """One rule for the mesh's sizes (`rljax.parallel.mesh_axis_sizes`): over 8 devices, a
  `parallel` the validation accepts is one `make_mesh` builds, and one it refuses names a
  `parallel.` field (the base config's micro-batch of 32 rows divides every batch split)."""
  jax = pytest.importorskip("jax")
  from rljax.parallel import make_mesh
  if jax.device_count() != 8:
    pytest.skip("needs the 8 simulated devices of tests/conftest.py")
  for data, fsdp, tensor in itertools.product((-1, 0, 1, 2, 3, 4, 8), repeat=3):
    c = base_config()
    apply_overrides(c, {"parallel.data": data, "parallel.fsdp": fsdp, "parallel.tensor": tensor})
    try:
      validate(c)
      accepted = True
    except ConfigError as e:
      accepted = False
      assert all(p.startswith("parallel.") for p in e.problems), e.problems
    try:
      make_mesh(data, fsdp, tensor)
      built = True
    except ValueError:
      built = False
    assert accepted == built, (data, fsdp, tensor)
