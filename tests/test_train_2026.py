"""The trainer with the 2026 options: reference refresh (checkpointed), IS-corrected KL,
PF-PPO resampling, OPO / GRPO pass@k advantages, and their config validation."""


import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from train_micro import micro_config, read_records

from rljax.train.config import ConfigError, apply_overrides, base_config, validate
from rljax.train.config.algo import PolicySourcesSpec
from rljax.train.config.fields import read
from rljax.train.loop import train
from rljax.train.params import Params, TrainState, init_optimizer_state


def _restored_state(run_dir, step):
  with ocp.PyTreeCheckpointer() as ckpt:
    return ckpt.restore(run_dir / "checkpoints" / str(step) / "state")


def _leaves(tree):
  return [np.asarray(x) for x in jax.tree.leaves(tree)]


@pytest.mark.slow
def test_prorl_reset_makes_the_checkpointed_reference_the_policy(tmp_path):
  """ref_refresh=reset every iteration: after the run the saved reference equals the saved
  policy, and the optimizer was restarted (Adam's step count 0)."""
  config = micro_config("grpo", tmp_path, **{
      "algo.kl_placement": "loss", "algo.kl_coef": 0.05, "algo.kl_is_correction": True,
      "algo.ref_refresh": "reset", "algo.ref_refresh_every": 1,
      "algo.ref_reset_optimizer": True, "algo.minibatches": 2})
  train(config)
  records = read_records(tmp_path / "grpo")
  assert [r.get("kl/ref_refreshed") for r in records] == [1, 1]
  assert all(np.isfinite(r["update/kl_ref"]) for r in records)
  saved = _restored_state(tmp_path / "grpo", 2)
  actor, ref = _leaves(saved["actor"]), _leaves(saved["ref"])
  assert len(actor) == len(ref) > 0
  for a, r in zip(actor, ref):
    np.testing.assert_array_equal(a, r)
  counts = [np.asarray(v) for k, v in jax.tree_util.tree_flatten_with_path(saved["actor_opt"])[0]
            if "count" in jax.tree_util.keystr(k)]
  assert counts and all(int(c) == 0 for c in counts)


def _toy_state(actor, ref):
  tx = optax.adam(1e-2)
  opt = init_optimizer_state(tx, actor)
  opt = jax.tree.map(lambda x: x + 1 if jnp.issubdtype(x.dtype, jnp.integer) else x, opt)
  state = TrainState(step=jnp.zeros(()), iteration=jnp.zeros(()), actor=actor,
                            actor_opt=opt, critic=None, critic_opt=None, ref=ref,
                            kl_coef=jnp.zeros(()), rng=jnp.zeros(2), skipped_updates=0,
                            nonfinite_in_row=0)
  return state, tx


def _toy_params(tx, **algo):
  c = base_config()
  apply_overrides(c, {f"algo.{k}": v for k, v in algo.items()})
  return Params(actor_graphdef=None, critic_graphdef=None, initial_actor=None,
                initial_critic=None, actor_tx=tx, critic_tx=None, mesh=None,
                sources=read(PolicySourcesSpec, c), seed=0)


def test_mix_refresh_runs_every_n_iterations_and_keeps_the_optimizer():
  actor, ref = {"w": jnp.array([4.0, 8.0])}, {"w": jnp.array([0.0, 0.0])}
  state, tx = _toy_state(actor, ref)
  params = _toy_params(tx, kl_placement="loss", kl_coef=0.1, ref_refresh="mix",
                       ref_refresh_every=3, ref_mix_alpha=0.25)
  same = params.refresh_reference(state, 0)     # iteration 1 of 3: not due
  np.testing.assert_array_equal(same.ref["w"], [0.0, 0.0])
  mixed = params.refresh_reference(state, 2)    # iteration 3: due
  np.testing.assert_allclose(mixed.ref["w"], [1.0, 2.0])
  assert jax.tree.leaves(mixed.actor_opt)[0] is jax.tree.leaves(state.actor_opt)[0]


def test_reset_refresh_copies_the_policy_and_optionally_resets_the_optimizer():
  actor, ref = {"w": jnp.array([4.0, 8.0])}, {"w": jnp.array([0.0, 0.0])}
  state, tx = _toy_state(actor, ref)
  for reset_opt in (False, True):
    params = _toy_params(tx, kl_placement="loss", kl_coef=0.1, ref_refresh="reset",
                         ref_refresh_every=1, ref_reset_optimizer=reset_opt)
    out = params.refresh_reference(state, 0)
    np.testing.assert_array_equal(out.ref["w"], actor["w"])
    count = int(out.actor_opt[0].count)
    assert count == (0 if reset_opt else 1)


@pytest.mark.slow
@pytest.mark.parametrize("extra", [
    {"algo.advantage": "opo", "algo.pf_ppo": "max_random", "algo.policy_loss": "luspo",
     "algo.loss_agg": "seq_mean_token_sum", "algo.minibatches": 2},
    {"algo.advantage": "grpo_passk", "algo.pf_ppo": "pow", "algo.policy_loss": "vespo",
     "algo.loss_agg": "token_mean"},
    {"algo.policy_loss": "dro", "algo.loss_agg": "token_mean", "algo.minibatches": 2},
    {"algo.advantage": "optimal_token_baseline", "algo.loss_agg": "token_mean"},
], ids=["opo_pf_ppo_luspo", "grpo_passk_vespo", "dro", "optimal_token_baseline"])
def test_options_without_an_experiment_file_train(extra, tmp_path):
  config = micro_config("grpo", tmp_path, **extra)
  assert train(config)["iterations"] == 2
  for r in read_records(tmp_path / "grpo"):
    assert np.isfinite(r["update/loss"]) and r["update/skipped"] == 0
    if config.algo.pf_ppo != "none":
      assert 0 < r["train/pf_ppo_unique_frac"] <= 1


@pytest.mark.parametrize("fields,needle", [
    ({"algo.policy_loss": "luspo"}, "algo.loss_agg='seq_mean_token_sum'"),
    ({"algo.kl_is_correction": True}, "algo.kl_is_correction"),
    ({"algo.ref_refresh": "mix", "algo.ref_refresh_every": 5}, "no reference model to refresh"),
    ({"algo.ref_refresh": "mix", "algo.kl_placement": "loss", "algo.kl_coef": 0.1},
     "algo.ref_refresh_every=0"),
    ({"algo.ref_reset_optimizer": True}, "algo.ref_reset_optimizer"),
    ({"algo.ref_mix_alpha": 1.5}, "algo.ref_mix_alpha"),
    ({"algo.policy_loss": "sapo", "algo.sapo_tau_neg": 0.0}, "algo.sapo_tau_neg"),
    ({"algo.pf_ppo": "top"}, "'max_random'"),
    ({"algo.advantage": "opo", "sampling.n": 1}, "algo.advantage='opo'"),
    ({"algo.pf_ppo": "pow", "algo.old_logp_source": "update"}, "algo.pf_ppo"),
])
def test_bad_2026_fields_are_named(fields, needle):
  c = base_config()
  apply_overrides(c, fields)
  with pytest.raises(ConfigError) as err:
    validate(c, num_devices=1)
  assert needle in str(err.value)
