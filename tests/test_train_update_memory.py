"""Skipping a non-finite update by `lax.cond`: the same new state as selecting between the
new and the old values, with fewer temporaries."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
from train_micro import built, micro_config

from rljax.train.update import step as update_step_module


def _minibatch(setup, b):
  rng = np.random.default_rng(0)
  t, p, v = setup.specs.rollout.max_new_tokens, setup.ctx.prompt_len, setup.model_cfg.vocab_size
  floats = lambda: rng.normal(size=(b, t)).astype(np.float32)  # noqa: E731
  ones = np.ones((b, t), np.float32)
  return {"prompt_tokens": rng.integers(3, v, (b, p)).astype(np.int32),
          "prompt_mask": np.ones((b, p), np.int32),
          "tokens": rng.integers(3, v, (b, t)).astype(np.int32), "mask": np.ones((b, t), np.int32),
          "old_logp": -np.abs(floats()), "ref_logp": -np.abs(floats()), "advantages": floats(),
          "returns": floats(), "old_values": floats(), "token_weights": ones, "is_weights": ones,
          "rng": np.asarray(jax.random.key_data(jax.random.split(jax.random.key(0), b))),
          "kl_coef": np.float32(0.0)}


def _select_apply(tx, grads, opt_state, params, enabled):
  """The former skip: both steps computed, then a select of the new or the old values."""
  updates, new_opt = tx.update(grads, opt_state, params)
  new_params = optax.apply_updates(params, updates)
  keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(enabled, n, o), new, old)  # noqa: E731
  return keep(new_params, params), keep(new_opt, opt_state)


def _run(tmp_path, monkeypatch, apply, enabled):
  if apply is not None:
    monkeypatch.setattr(update_step_module, "_apply", apply)
  s, state, trainer = built(micro_config(
      "grpo", tmp_path, **{"model.num_layers": 2, "model.hidden_size": 64,
                           "model.intermediate_size": 4096, "sampling.max_new_tokens": 8,
                           "parallel.num_devices": 1}))
  batch = _minibatch(s, 2)
  flag = jnp.asarray(enabled)
  temp = trainer.update_step.lower(state, batch, flag).compile().memory_analysis()
  params = sum(x.nbytes for x in jax.tree.leaves(state.actor))
  new_state, metrics = trainer.update_step(state, batch, flag)
  leaves = [np.asarray(x) for x in jax.tree.leaves((new_state.actor, new_state.actor_opt))]
  return temp.temp_size_in_bytes, params, leaves, float(metrics["loss"])


def test_cond_skip_equals_select_with_fewer_temporaries(tmp_path, monkeypatch):
  for enabled in (True, False):
    temp, params, leaves, loss = _run(tmp_path / f"c{enabled}", monkeypatch, None, enabled)
    with monkeypatch.context() as m:
      old_temp, _, old_leaves, old_loss = _run(tmp_path / f"s{enabled}", m, _select_apply,
                                               enabled)
    assert loss == old_loss
    for a, b in zip(leaves, old_leaves, strict=True):
      np.testing.assert_array_equal(a, b)
    if enabled:   # measured 17.9 vs 19.5 MB (parameters 6.4 MB)
      assert temp < old_temp - 0.15 * params, (temp, old_temp, params)
