"""The trainer's programs are traced under their mesh (`rljax.parallel.traced_on`), so that
model.attention="auto" picks splash on a TPU slice; on CPU devices this changes no number:
the update step, the log-prob forward and the static sampler, on 8 devices (data 2 x fsdp 2
x tensor 2), give what they gave traced without the mesh, bit for bit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from train_micro import micro_config

from rljax import parallel
from rljax.models import Decoder, ModelConfig
from rljax.plan.abstract import abstract_run
from rljax.plan.programs import iteration_programs
from rljax.plan.topology import local_topology
from rljax.sampling import SamplingParams, generate

# T = 240: S = P + T > 256, so that "auto" is the chunked attention on CPU
SHAPES = {"sampling.max_new_tokens": 240, "model.max_position_embeddings": 512,
          "parallel.data": 2, "parallel.fsdp": 2, "parallel.tensor": 2}


def _untraced(monkeypatch):
  """The trainer as it was: no program traced under its mesh."""
  identity = lambda mesh, fn: fn  # noqa: E731
  monkeypatch.setattr(parallel, "traced_on", identity)
  monkeypatch.setattr("rljax.sampling.sampler.traced_on", identity)


def _concrete(args, vocab: int):
  """Arrays for the abstract `args` (same values every call): ones for masks, token ids
  below `vocab` for other integers, small normal floats; placed with their shardings."""
  rng = np.random.default_rng(0)

  def make(path, x):
    name = jax.tree_util.keystr(path)
    if jnp.issubdtype(x.dtype, jnp.integer) or x.dtype == jnp.bool_:
      high = 2 if "mask" in name or x.dtype == jnp.bool_ else vocab
      value = np.ones(x.shape) if high == 2 else rng.integers(0, high, x.shape)
      value = value if x.dtype != jnp.uint32 else rng.integers(0, 2 ** 31, x.shape)
    else:
      value = 0.02 * rng.standard_normal(x.shape)
    return jax.device_put(np.asarray(value).astype(x.dtype), x.sharding)
  return jax.tree_util.tree_map_with_path(make, args)


def _outputs(config, names=("logprobs", "update")):
  """{program: its outputs on fixed inputs}, the trainer's own builders (via the plan)."""
  devices = jax.devices()
  run = abstract_run(config, devices, local_topology(devices))
  out = {}
  for program in iteration_programs(run):
    if program.name in names:
      lowered, args = program.lower()
      if program.name == "update":   # the jitted step takes (state, LoRA base, ...): no LoRA
        args = (args[0], None, *args[1:])
      out[program.name] = lowered.compile()(*_concrete(args, run.model_cfg.vocab_size))
  return out


@pytest.mark.parametrize("attention", ["auto", "xla", "chunked"])
def test_update_and_forward_traced_under_the_mesh_change_no_number(tmp_path, monkeypatch,
                                                                    attention):
  assert jax.device_count() == 8
  config = micro_config("grpo", tmp_path, **SHAPES, **{"model.attention": attention})
  under_mesh = _outputs(config)
  _untraced(monkeypatch)
  before = _outputs(config)
  for name in before:
    for a, b in zip(jax.tree.leaves(under_mesh[name]), jax.tree.leaves(before[name])):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=name)


@pytest.mark.parametrize("attention", ["auto", "xla", "chunked"])
def test_static_sampler_traced_under_the_mesh_changes_no_number(monkeypatch, attention):
  cfg = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
                    num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=512,
                    attention=attention)
  model = Decoder(cfg, rngs=nnx.Rngs(0))
  rows = np.random.default_rng(1).integers(1, 64, (4, 300))   # P = 300 > 256: auto = chunked
  mask = np.ones_like(rows)
  kwargs = dict(sampling=SamplingParams(max_new_tokens=6, temperature=1.0, n=2),
                rng=jax.random.key(0), mesh=parallel.make_mesh(2, 2, 2))
  under_mesh = generate(model, rows, mask, **kwargs)
  _untraced(monkeypatch)
  jax.clear_caches()   # the sampler's jit is module-level: trace it again
  before = generate(model, rows, mask, **kwargs)
  np.testing.assert_array_equal(under_mesh.tokens, before.tokens)
  np.testing.assert_array_equal(under_mesh.logp, before.logp)
