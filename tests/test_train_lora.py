"""LoRA in the trainer: only adapters train, the base is never copied, returned or
checkpointed per step, the reference is the base with the adapters off, resume is exact,
and 8 devices equal 1."""

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import nnx
from tolerances import f32_atol
from train_micro import built, micro_config, read_records

from rljax.train.config import ConfigError
from rljax.train.loop import train

LORA = {"model.lora_rank": 4, "model.lora_alpha": 8.0, "optim.actor_lr": 1e-3}


def _nbytes(tree):
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


def _state(tmp_path, **extra):
  config = micro_config("grpo", tmp_path, **{**LORA, **extra})
  _, state, trainer = built(config)
  return trainer, state


def test_optimizer_state_holds_only_adapters_and_the_base_is_frozen(tmp_path):
  setup, state = _state(tmp_path)
  lora_leaves = jax.tree.leaves(state.actor)
  assert len(lora_leaves) == 2 * 7 * 1                      # A and B, 7 targets, 1 layer
  assert all(isinstance(v, nnx.LoRAParam) for v in jax.tree.leaves(
      state.actor, is_leaf=lambda x: isinstance(x, nnx.Variable)))
  adam_moments = [x for x in jax.tree.leaves(state.actor_opt) if x.ndim > 0]
  assert _nbytes(adam_moments) == 2 * _nbytes(state.actor)  # mu and nu of the adapters only
  assert state.ref is None and state.base is not None


def test_update_step_neither_returns_nor_copies_the_base(tmp_path):
  from rljax.train.update.step import UPDATE_KEYS

  setup, state = _state(tmp_path)
  b, p, t = 8, 16, 24
  batch = {k: np.zeros((b, t), np.float32) for k in UPDATE_KEYS}
  batch.update(prompt_tokens=np.ones((b, p), np.int32), prompt_mask=np.ones((b, p), np.int32),
               tokens=np.ones((b, t), np.int32), mask=np.ones((b, t), np.int32),
               token_weights=np.ones((b, t), np.float32), is_weights=np.ones((b, t), np.float32),
               rng=np.asarray(jax.random.key_data(jax.random.split(jax.random.key(0), b))))
  batch["kl_coef"] = np.float32(0.0)
  compiled = setup.update_step.lower(state, batch, np.bool_(True)).compile()
  memory = compiled.memory_analysis()
  base = _nbytes(state.base)
  trainable = _nbytes(state.actor) + _nbytes(state.actor_opt)
  assert memory.output_size_in_bytes < trainable + 4096 < base       # no base in the outputs
  assert memory.argument_size_in_bytes < base + 2 * trainable + _nbytes(batch) + 4096
  before = [np.asarray(x).copy() for x in jax.tree.leaves(state.base)]
  def pointers(tree):   # every device's buffer of every base leaf
    return [s.data.unsafe_buffer_pointer() for x in jax.tree.leaves(tree)
            for s in x.addressable_shards]
  old_pointers = pointers(state.base)
  new_state, _ = setup.update_step(state, batch, np.bool_(True))
  assert pointers(new_state.base) == old_pointers
  for x, y in zip(jax.tree.leaves(new_state.base), before):
    np.testing.assert_array_equal(np.asarray(x), y)


def test_reference_is_the_base_and_kl_grows_from_zero(tmp_path):
  config = micro_config("grpo", tmp_path, **{**LORA, "algo.kl_placement": "loss",
                                             "algo.kl_coef": 0.1, "run.iterations": 3})
  train(config)
  records = read_records(tmp_path / "grpo")
  # iteration 1 samples from the base (B = 0): the reference log-probs are the policy's
  assert records[0]["kl/to_ref"] == 0.0
  assert records[-1]["kl/to_ref"] > 0.0 and records[-1]["update/kl_ref"] > 0.0


def test_checkpoints_hold_adapters_and_resume_is_bit_identical(tmp_path):
  straight = micro_config("grpo", tmp_path / "a", **{**LORA, "run.iterations": 3,
                                                     "run.save_every": 1})
  train(straight)
  split = micro_config("grpo", tmp_path / "b", **{**LORA, "run.iterations": 3,
                                                  "run.save_every": 1})
  train(split, stop_after=1)
  train(split)
  drop = lambda rs: [{k: v for k, v in r.items() if not k.startswith("time/")  # noqa: E731
                      and k != "compile/programs"} for r in rs]
  assert drop(read_records(tmp_path / "a" / "grpo")) == drop(read_records(tmp_path / "b" / "grpo"))
  with ocp.PyTreeCheckpointer() as ckpt:
    saved = {d: ckpt.restore(tmp_path / d / "grpo" / "checkpoints" / "3" / "state")
             for d in ("a", "b")}
  flat = dict(jax.tree_util.tree_flatten_with_path(saved["a"])[0])
  names = [jax.tree_util.keystr(k) for k in flat]
  actor = [n for n in names if n.startswith("['actor']")]
  assert actor and all("_lora" in n for n in actor)           # adapters only, no base weight
  assert not any(n.startswith("['base']") for n in names)
  for x, y in zip(jax.tree.leaves(saved["a"]), jax.tree.leaves(saved["b"])):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  assert (tmp_path / "a" / "grpo" / "lora_base").is_dir()      # the base, written once


def test_eight_devices_equal_one_with_lora(tmp_path):
  runs = {}
  for devices in (1, 8):
    config = micro_config("grpo", tmp_path / f"d{devices}", **{
        **LORA, "parallel.num_devices": devices,
        "task.reward_fns": ["tests/signal_rewards.py:digit_share"]})
    train(config)
    runs[devices] = read_records(tmp_path / f"d{devices}" / "grpo")
  assert runs[1][-1]["update/grad_norm"] > 0
  for one, eight in zip(runs[1], runs[8]):
    assert one["train/raw_score"] == eight["train/raw_score"]
    for key in ("update/loss", "update/grad_norm", "update/entropy"):
      # a loss is a mean of O(1) terms that can cancel to ~0: the terms' rounding bounds it
      np.testing.assert_allclose(eight[key], one[key], rtol=2e-5, atol=f32_atol(1.0, ulps=64),
                                 err_msg=key)


@pytest.mark.parametrize("fields, needle", [
    ({"model.lora_rank": -1}, "model.lora_rank"),
    ({"model.lora_targets": ["q", "qkv"]}, "model.lora_targets"),
    ({"algo.ref_refresh": "mix", "algo.ref_refresh_every": 2, "algo.kl_placement": "loss"},
     "not supported with model.lora_rank"),
])
def test_bad_lora_fields_are_named(fields, needle, tmp_path):
  with pytest.raises(ConfigError, match=needle):
    micro_config("grpo", tmp_path, **{**LORA, **fields})
