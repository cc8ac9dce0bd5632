"""Logical-axis rules, meshes, sharded forward == unsharded, replicated-fraction check."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P
from tolerances import assert_close_f32

from rljax.models import Decoder, ModelConfig
from rljax.models.logprobs import token_logprobs
from rljax.parallel import (
    LOGICAL_AXIS_RULES,
    assert_sharded,
    batch_sharding,
    batch_shards,
    initialize_distributed,
    logical_to_mesh_spec,
    make_mesh,
    mesh_axis_sizes,
    replicated_fraction,
    shard_model,
    sharding_report,
)

CFG = ModelConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_layers=1,
                  num_heads=4, num_kv_heads=2, head_dim=16, attention_bias=True, qk_norm=True)


def test_rules_golden():
  assert logical_to_mesh_spec(("embed", "mlp")) == P("fsdp", "tensor")
  assert logical_to_mesh_spec(("vocab", "embed")) == P("tensor", "fsdp")
  assert logical_to_mesh_spec(("heads", "kv", "embed")) == P("tensor", None, "fsdp")
  assert logical_to_mesh_spec(("batch", None)) == P(("data", "fsdp"), None)
  assert logical_to_mesh_spec(("mlp", "heads")) == P("tensor", None)  # an axis used once
  with pytest.raises(ValueError, match="'experts'"):
    logical_to_mesh_spec(("experts",))


def test_make_mesh_sizes():
  mesh = make_mesh(data=-1, fsdp=4, tensor=2)
  assert dict(mesh.shape) == {"data": 1, "fsdp": 4, "tensor": 2}
  assert dict(make_mesh().shape) == {"data": 8, "fsdp": 1, "tensor": 1}
  with pytest.raises(ValueError, match="devices"):
    make_mesh(data=3, fsdp=1, tensor=1)


def test_batch_shards_count_the_batch_axes_only():
  assert batch_shards(None) == 1
  assert batch_shards(make_mesh(data=2, fsdp=2, tensor=2)) == 4   # data x fsdp, not tensor
  assert batch_shards(make_mesh(data=1, fsdp=1, tensor=8)) == 1
  only_data = jax.make_mesh((8,), ("data",), devices=jax.devices())
  assert batch_shards(only_data) == 8   # an axis the mesh lacks counts 1
  rows = jnp.zeros((8, 3))
  mesh = make_mesh(data=2, fsdp=2, tensor=2)
  placed = jax.device_put(rows, batch_sharding(mesh, 2))   # what the count describes
  assert len({str(s.index) for s in placed.addressable_shards}) == batch_shards(mesh)


def test_every_parameter_has_known_logical_axes():
  known = dict(LOGICAL_AXIS_RULES)
  model = Decoder(CFG, rngs=nnx.Rngs(0))
  for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
    axes = var.get_metadata().get("out_sharding")
    assert axes is not None and len(axes) == var.ndim, path
    assert all(a in known for a in axes), (path, axes)


@nnx.jit
def _forward(model, tokens, positions, mask):
  return model(tokens, positions=positions, attention_mask=mask)


@nnx.jit
def _grad(model, tokens, positions, mask):
  loss = lambda m: jnp.sum(token_logprobs(m, tokens, positions, mask, prompt_len=3,
                                          temperature=0.9, chunk_size=2))
  return nnx.grad(loss)(model)


@pytest.mark.parametrize("scan_layers", [True, False])
def test_sharded_forward_and_grad_equal_unsharded(scan_layers):
  cfg = CFG.replace(num_layers=2, scan_layers=scan_layers)
  ref = Decoder(cfg, rngs=nnx.Rngs(1))
  rng = np.random.default_rng(0)
  mask = np.ones((4, 7), np.int32)
  mask[1, :2] = 0
  tokens = jnp.asarray(rng.integers(1, CFG.vocab_size, mask.shape) * mask, jnp.int32)
  positions = jnp.asarray(np.maximum(np.cumsum(mask, 1) - 1, 0), jnp.int32)
  mask = jnp.asarray(mask)
  want = _forward(ref, tokens, positions, mask)
  want_grad = _grad(ref, tokens, positions, mask)

  mesh = make_mesh(data=1, fsdp=4, tensor=2)
  model = shard_model(Decoder(cfg, rngs=nnx.Rngs(1)), mesh)
  # a stack's leading "layers" axis is never split; each layer is sharded as it was
  layer, lead = (model.layers[0].layer, (None,)) if scan_layers else (model.layers[0], ())
  assert layer.mlp.gate[...].sharding.spec == P(*lead, "fsdp", "tensor")
  assert layer.attn.o[...].sharding.spec == P(*lead, "tensor", None, "fsdp")
  assert model.embed[...].sharding.spec == P("tensor", "fsdp")
  batch = [jax.device_put(x, batch_sharding(mesh, 2)) for x in (tokens, positions, mask)]
  got = _forward(model, *batch)
  assert len(got.sharding.device_set) == 8
  # fsdp x tensor sharded vs one device: other matmul splits and reduction orders
  assert_close_f32(got, want, ulps=256)
  got_grad = _grad(model, *batch)
  if scan_layers:   # the stacked gradient comes out sharded like its parameter
    gate_grad = got_grad["layers"][0]["layer"]["mlp"]["gate"][...]
    assert gate_grad.sharding.is_equivalent_to(layer.mlp.gate[...].sharding, 3)
  # the bound scales with the largest gradient (some leaves are ~0 up to rounding)
  g_max = max(float(np.abs(np.asarray(g)).max()) for g in jax.tree.leaves(want_grad))
  for a, b in zip(jax.tree.leaves(got_grad), jax.tree.leaves(want_grad)):
    assert_close_f32(a, b, ulps=256, scale=g_max)


def test_replicated_fraction():
  model = Decoder(CFG.replace(num_kv_heads=1), rngs=nnx.Rngs(2))
  assert replicated_fraction(model) == 1.0  # on one device everything is replicated
  with pytest.raises(ValueError, match="100.0% of parameter bytes.*embed"):
    assert_sharded(model)
  flat = nnx.to_flat_state(nnx.state(model, nnx.Param))
  total = sum(v.nbytes for _, v in flat)
  # fully replicated: norm scales by design, and the k/v biases [K=1, Dh] whose only
  # shardable dimension (one KV head) cannot be split; k/v kernels still split "embed".
  expected = sum(v.nbytes for p, v in flat
                 if "norm" in "/".join(map(str, p)) or p[-1] in ("k_bias", "v_bias"))
  shard_model(model, make_mesh(data=1, fsdp=4, tensor=2))
  report = sharding_report(model)
  assert report["replicated_fraction"] == pytest.approx(expected / total)
  assert 0 < report["replicated_fraction"] < 0.1
  assert assert_sharded(model) == report["replicated_fraction"]
  assert report["max_device_bytes"] < total / 4  # real memory saving per device


def test_initialize_distributed_single_process_is_noop(monkeypatch):
  for k in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
    monkeypatch.delenv(k, raising=False)
  assert initialize_distributed() is False
  assert initialize_distributed(num_processes=1) is False


def _tilings(num_devices):
  """Every (data, fsdp, tensor, expert) with positive sizes that tile `num_devices`."""
  return {(d, f, t, e) for e in range(1, num_devices + 1) for d in range(1, num_devices + 1)
          for f in range(1, num_devices + 1) for t in range(1, num_devices + 1)
          if d * f * t * e == num_devices}


@pytest.mark.parametrize("num_devices", [1, 6, 8])
def test_mesh_axis_sizes_against_every_tiling(num_devices):
  """The sizes it accepts are exactly those that tile the devices (at most one -1 standing
  for a positive size that completes the product); every other request raises, naming a size."""
  tilings = _tilings(num_devices)
  choices = (-2, -1, 0, 1, 2, 3, 4, 8)
  for data, fsdp, tensor in itertools.product(choices, repeat=3):
    for expert in (0, 1, 2, 3, 4):
      sizes = (data, fsdp, tensor)
      fills = [tuple(v if v != -1 else fill for v in sizes) + (expert,)
               for fill in range(1, num_devices + 1)]
      valid = (sizes.count(-1) <= 1 and all(v >= 1 or v == -1 for v in sizes)
               and any(f in tilings for f in fills))
      if valid:
        got = mesh_axis_sizes(data, fsdp, tensor, expert=expert, num_devices=num_devices)
        assert tuple(got) + (expert,) in tilings and all(
            g == v for g, v in zip(got, sizes) if v != -1), (sizes, expert, got)
      else:
        with pytest.raises(ValueError, match=r"^(data|fsdp|tensor|expert)"):
          mesh_axis_sizes(data, fsdp, tensor, expert=expert, num_devices=num_devices)
