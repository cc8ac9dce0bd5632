"""Memory options: reference offload changes nothing but where the reference lives;
remat and micro-batching really lower the update step's temporary memory."""


import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tolerances import assert_close_f32, f32_atol
from train_micro import built, micro_config, read_records

from rljax import parallel
from rljax.train.config import ConfigError
from rljax.train.loop import train
from rljax.train.params import offload
from rljax.train.run.build import build
from rljax.train.update.forward import SEQUENCE_KEYS, ForwardFns
from rljax.train.update.prepare import Preparer
from rljax.train.update.step import Epochs

KL = {"algo.kl_placement": "loss", "algo.kl_coef": 0.1}
PREPARE, RUN_UPDATES = Preparer.prepare, Epochs.run


def _kinds(tree):
  return {getattr(x.sharding, "memory_kind", None) for x in jax.tree.leaves(tree)}


def _spy(monkeypatch, seen):
  """Records the reference log-probs of each rollout and where `state.ref` lives when an
  iteration starts and after its updates."""
  prepare, run_updates = PREPARE, RUN_UPDATES

  def spy_prepare(preparer, state, *args, **kwargs):
    seen["ref_kinds"].append(_kinds(state.ref))
    upd, metrics, moments = prepare(preparer, state, *args, **kwargs)
    seen["ref_logp"].append(np.asarray(upd.ref_logp))
    return upd, metrics, moments

  def spy_updates(epochs, state, *args, **kwargs):
    state, metrics, token_outputs = run_updates(epochs, state, *args, **kwargs)
    seen["ref_kinds"].append(_kinds(state.ref))
    return state, metrics, token_outputs

  monkeypatch.setattr(Preparer, "prepare", spy_prepare)
  monkeypatch.setattr(Epochs, "run", spy_updates)


def _comparable(records):
  drop = lambda k: k.startswith("time/") or k == "compile/programs"  # noqa: E731
  return [{k: v for k, v in r.items() if not drop(k)} for r in records]


def test_reference_offload_gives_identical_runs_and_keeps_ref_in_host_memory(
    tmp_path, monkeypatch):
  """KL in the loss, 8 devices. The offloaded run is stopped after iteration 1 and resumed
  from its checkpoint (the ref is restored into host memory); reference log-probs, losses
  and KL metrics equal the run without offload exactly, without extra compilations."""
  assert offload.host_memory_supported()   # JAX 0.10.2's CPU backend has pinned_host
  runs = {}
  for off in (False, True):
    seen = {"ref_kinds": [], "ref_logp": []}
    _spy(monkeypatch, seen)
    overrides = dict(KL, **{"algo.reference_offload": off, "run.save_every": 1})
    train(micro_config("grpo", tmp_path / str(off), **overrides), stop_after=1 if off else None)
    if off:   # resume: a fresh process would do the same (template -> orbax restore)
      train(micro_config("grpo", tmp_path / str(off), **overrides))
    runs[off] = seen, read_records(tmp_path / str(off) / "grpo")
  (plain, plain_rec), (off, off_rec) = runs[False], runs[True]
  assert plain["ref_kinds"] == [{"device"}] * 4
  assert off["ref_kinds"] == [{"pinned_host"}] * 4
  assert len(off["ref_logp"]) == 2
  for a, b in zip(plain["ref_logp"], off["ref_logp"]):
    np.testing.assert_array_equal(a, b)
  assert _comparable(off_rec) == _comparable(plain_rec)
  assert all(r["update/kl_ref"] > 0 for r in off_rec)
  counts = [r["compile/programs"] for r in off_rec]
  assert counts[0] == counts[1], counts


def test_numpy_fallback_round_trip(monkeypatch):
  """Without a pinned_host memory the reference is kept as NumPy copies (not views of
  buffers the update step may donate) and fetched back with the actor's shardings."""
  monkeypatch.setattr(offload, "host_memory_supported", lambda devices=None: False)
  actor = {"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.ones(3)}
  host = offload.to_host(actor)
  assert all(isinstance(x, np.ndarray) for x in jax.tree.leaves(host))
  host["w"][0, 0] = 7.0   # a real copy: writing it leaves the device array alone
  assert float(actor["w"][0, 0]) == 0.0
  back = offload.fetch(host, actor)
  assert _kinds(back) == {"device"}
  assert back["b"].sharding == actor["b"].sharding
  np.testing.assert_array_equal(back["w"], host["w"])
  assert offload.fetch(actor, actor) is actor


def test_reference_offload_is_validated(tmp_path):
  with pytest.raises(ConfigError, match="no reference model to offload"):
    micro_config("grpo", tmp_path, **{"algo.reference_offload": True})
  with pytest.raises(TypeError, match="reference_offload"):   # a typed (bool) field
    micro_config("grpo", tmp_path, **dict(KL, **{"algo.reference_offload": "yes"}))


def _minibatch(setup, b):
  rng = np.random.default_rng(0)
  t, p, v = setup.specs.rollout.max_new_tokens, setup.ctx.prompt_len, setup.model_cfg.vocab_size
  mask = (np.arange(t)[None] < rng.integers(1, t + 1, size=b)[:, None]).astype(np.int32)
  floats = lambda: rng.normal(size=(b, t)).astype(np.float32)  # noqa: E731
  return {
      "prompt_tokens": rng.integers(3, v, (b, p)).astype(np.int32),
      "prompt_mask": np.ones((b, p), np.int32), "tokens": rng.integers(3, v, (b, t)).astype(np.int32),
      "mask": mask, "old_logp": -np.abs(floats()), "ref_logp": -np.abs(floats()),
      "advantages": floats(), "returns": floats(), "old_values": floats(),
      "token_weights": np.ones((b, t), np.float32), "is_weights": np.ones((b, t), np.float32),
      "rng": np.asarray(jax.random.key_data(jax.random.split(jax.random.key(0), b))),
      "kl_coef": np.float32(0.0),
  }


def _update_memory_report(tmp_path):
  """Temp bytes of the compiled update step for three variants, and the metrics / new
  parameters of base and remat after one step on the same batch."""
  small = {"model.num_layers": 4, "model.hidden_size": 128, "model.intermediate_size": 384,
           "model.head_dim": 64, "sampling.max_new_tokens": 960, "model.max_position_embeddings": 1024,
           "parallel.num_devices": 1}
  report, params = {}, {}
  for name, extra in {"base": {}, "remat": {"model.remat": True},
                      "micro4": {"algo.microbatches": 4}}.items():
    s, state, trainer = built(micro_config("grpo", tmp_path, **small, **extra))
    batch = _minibatch(s, 4)
    compiled = trainer.update_step.lower(state, batch, jnp.asarray(True)).compile()
    report[name] = {"temp": compiled.memory_analysis().temp_size_in_bytes}
    if name != "micro4":
      new_state, metrics = trainer.update_step(state, batch, jnp.asarray(True))
      report[name].update({k: float(metrics[k]) for k in ("loss", "pg_loss", "grad_norm",
                                                          "entropy")})
      params[name] = jax.tree.leaves(jax.tree.map(np.asarray, new_state.actor))
  report["param_max_abs_diff"] = max(float(np.max(np.abs(a - b)))
                                     for a, b in zip(params["base"], params["remat"]))
  report["param_max_abs"] = max(float(np.max(np.abs(a))) for a in params["base"])
  return report


def test_remat_and_microbatches_lower_update_temp_memory(tmp_path):
  """XLA's compiled temp bytes of the real update step (4 layers, 4 sequences x ~1,000 tokens):
  remat and 4 micro-batches each cut them; remat leaves loss, gradient norm and the new
  parameters unchanged (micro-batch equality: tests/test_train_e2e.py).

  Note: with `model.remat` the update step is compiled in XLA CPU's memory order
  (`rljax.parallel.low_memory_compiler_options`), as a user gets it, with no XLA flag.
  Measured here: remat 0.43x the base's temporaries (0.47x in the default order, which
  runs recomputations early; Qwen2.5-0.5B's update with remat: 2,502 vs 3,769 MB), 4 micro-batches
  0.27x. On short sequences (~100 tokens) remat saves nothing: the activations it drops
  are small next to the rest."""
  report = _update_memory_report(tmp_path)
  temps = {k: report[k]["temp"] for k in ("base", "remat", "micro4")}
  assert temps["remat"] < 0.9 * temps["base"], temps   # measured 0.43
  assert temps["micro4"] < 0.5 * temps["base"], temps
  for key in ("loss", "pg_loss", "grad_norm", "entropy"):
    # a loss near 0 (a mean of O(1) terms) keeps the terms' rounding: 64 eps32 of 1
    np.testing.assert_allclose(report["remat"][key], report["base"][key], rtol=1e-5,
                               atol=f32_atol(1.0, ulps=64), err_msg=key)
  # the new parameters: the rounding of p + Δ and of a recomputed gradient, relative to |p|
  assert report["param_max_abs_diff"] < f32_atol(report["param_max_abs"], ulps=16), report


def test_rollout_forward_in_microbatches_is_equal_and_smaller(tmp_path):
  """`algo.microbatches` also chunks the rollout forwards (old / reference log-probs,
  entropies): same values in the same row order, less temporary memory (8 sequences of
  ~500 tokens; measured 0.17x of the temp bytes with 4 chunks)."""
  small = {"model.hidden_size": 64, "model.intermediate_size": 192, "model.head_dim": 32,
           "sampling.max_new_tokens": 480, "model.max_position_embeddings": 512,
           "parallel.num_devices": 1}
  out = {}
  for micro in (1, 4):
    s = build(micro_config("grpo", tmp_path, **small, **{"algo.microbatches": micro}))
    fns = ForwardFns(s.specs.loss, s.params.actor_graphdef, None, num_micro=micro, mesh=s.mesh)
    batch = {k: v for k, v in _minibatch(s, 8).items() if k in SEQUENCE_KEYS}
    compiled = fns.policy_stats.lower(s.params.initial_actor, batch).compile()
    logp, entropy = fns.policy_stats(s.params.initial_actor, batch)
    out[micro] = (compiled.memory_analysis().temp_size_in_bytes, np.asarray(logp),
                  np.asarray(entropy))
  # 4 chunks vs one forward: other batch shapes, other matmul and softmax sums
  assert_close_f32(out[4][1], out[1][1], ulps=256)
  assert_close_f32(out[4][2], out[1][2], ulps=256)
  assert out[4][0] < 0.6 * out[1][0], (out[4][0], out[1][0])


def test_low_memory_compiler_options_for_big_or_remat_cpu_programs():
  """Memory order for a CPU program whose arguments reach 1 GiB or that rematerialises;
  XLA CPU's default order for a small one; nothing for another platform."""
  small = {"w": jax.ShapeDtypeStruct((1024, 1024), jnp.float32)}                 # 4 MiB
  big = {"w": jax.ShapeDtypeStruct((256, 1024, 1024), jnp.float32), "step": 3}  # 1 GiB
  order = {"xla_cpu_scheduler_type": "CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED"}
  assert parallel.low_memory_compiler_options(None, small) == {}
  assert parallel.low_memory_compiler_options(None, big) == order
  assert parallel.low_memory_compiler_options(None, small, remat=True) == order
  cpu_mesh = parallel.make_mesh(data=1, fsdp=1, tensor=1, devices=jax.devices()[:1])
  assert parallel.low_memory_compiler_options(cpu_mesh, big) == order
  tpu_mesh = types.SimpleNamespace(devices=np.array([types.SimpleNamespace(platform="tpu")]))
  assert parallel.low_memory_compiler_options(tpu_mesh, big, remat=True) == {}
  # the option is one XLA CPU knows: a program compiles with it and computes the same
  f = lambda x: jnp.tanh(x @ x.T).sum(0)  # noqa: E731
  x = jnp.linspace(-1.0, 1.0, 64 * 32, dtype=jnp.float32).reshape(64, 32)
  np.testing.assert_array_equal(jax.jit(f, compiler_options=order)(x), jax.jit(f)(x))
