"""Scanned layers' state layout: per-layer <-> stacked conversion of parameters, optimizer
state and orbax restore targets; checkpoints written in one layout restore into the other."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from rljax.models import Decoder, RewardModel
from rljax.models.stack import (
    LayerStack,
    checkpoint_layout,
    per_layer_layout,
    restore_in_layout,
    stack_like,
    stack_modules,
)
from rljax.models.testing import perturb_params, tiny_config
from rljax.parallel import make_mesh, shard_model


def _pair(num_layers=3, seed=0):
  """(scanned, per-layer) decoders with the same parameters."""
  looped = perturb_params(Decoder(tiny_config(num_layers=num_layers, scan_layers=False),
                                  rngs=nnx.Rngs(seed)), seed=seed)
  scanned = Decoder(tiny_config(num_layers=num_layers), rngs=nnx.Rngs(seed))
  nnx.update(scanned, stack_like(nnx.state(looped), nnx.state(scanned)))
  return scanned, looped


def _assert_same_tree(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  jax.tree.map(np.testing.assert_array_equal, a, b)


def test_per_layer_layout_and_stack_like_are_inverse():
  scanned, looped = _pair()
  stacked, per_layer = nnx.state(scanned), nnx.state(looped)
  q = stacked["layers"][0]["layer"]["attn"]["q"]
  assert q[...].shape == (3, 64, 4, 16)
  assert q.get_metadata()["out_sharding"] == ("layers", "embed", "heads", "kv")
  back = per_layer_layout(stacked)
  assert sorted(back["layers"]) == [0, 1, 2]
  assert back["layers"][2]["attn"]["q"].get_metadata()["out_sharding"] == ("embed", "heads", "kv")
  _assert_same_tree(back, per_layer)
  np.testing.assert_array_equal(back["layers"][2]["attn"]["q"][...], q[...][2])
  _assert_same_tree(stack_like(per_layer, stacked), stacked)
  # the optimizer's moments mirror the parameters: converted alike, inside optax's tuples
  tx = optax.adamw(1e-3)
  opt = tx.init(nnx.state(scanned, nnx.Param))
  per_layer_opt = per_layer_layout(opt)
  assert jax.tree.structure(per_layer_opt) == jax.tree.structure(tx.init(
      nnx.state(looped, nnx.Param)))
  _assert_same_tree(stack_like(per_layer_opt, opt), opt)


def test_stack_like_keeps_the_targets_shardings():
  scanned, looped = _pair(num_layers=2)
  mesh = make_mesh(data=1, fsdp=4, tensor=2)
  shard_model(scanned, mesh)
  out = stack_like(nnx.state(looped), nnx.state(scanned))   # (other leaves pass as they are)
  stacked = jax.tree.leaves(out["layers"])
  for got, want in zip(stacked, jax.tree.leaves(nnx.state(scanned)["layers"]), strict=True):
    assert got.sharding.is_equivalent_to(want.sharding, got.ndim)
  assert out["layers"][0]["layer"]["mlp"]["gate"][...].sharding.spec == P(None, "fsdp", "tensor")


def test_stack_modules_refuses_different_structures():
  a = Decoder(tiny_config(scan_layers=False), rngs=nnx.Rngs(0)).layers[0]
  b = Decoder(tiny_config(scan_layers=False, intermediate_size=32), rngs=nnx.Rngs(0)).layers[0]
  with pytest.raises(ValueError, match="differ in structure"):
    stack_modules([a, b])
  assert isinstance(LayerStack([a, a]), LayerStack)


@pytest.mark.parametrize("saved_scanned", [False, True])
def test_a_checkpoint_restores_into_either_layout(tmp_path, saved_scanned):
  """Orbax restore targets converted by `checkpoint_layout`: a per-layer checkpoint (written
  before layers were scanned) restores into a scanned model, and the other way round."""
  scanned, looped = _pair()
  saved, other = (scanned, looped) if saved_scanned else (looped, scanned)
  with ocp.StandardCheckpointer() as ckpt:
    ckpt.save(tmp_path / "ckpt", nnx.state(saved))
  target = jax.tree.map(ocp.utils.to_shape_dtype_struct, nnx.state(other))
  with ocp.StandardCheckpointer() as ckpt:
    tree = ckpt.metadata(tmp_path / "ckpt").item_metadata
    restore_target, _ = checkpoint_layout(tree, target)
    assert jax.tree.structure(restore_target) != jax.tree.structure(target)
    out = restore_in_layout(lambda t: ckpt.restore(tmp_path / "ckpt", t), tree, target)
    _assert_same_tree(out, nnx.state(other))
    same, _ = checkpoint_layout(tree, jax.tree.map(ocp.utils.to_shape_dtype_struct,
                                                   nnx.state(saved)))
    assert jax.tree.structure(same) == jax.tree.structure(nnx.state(saved))


def test_a_reward_model_saved_per_layer_loads_scanned(tmp_path):
  from rljax.rewards.reward_model import load_reward_model, save_reward_model

  cfg = tiny_config(num_layers=2, scan_layers=False)
  per_layer = perturb_params(RewardModel(cfg, rngs=nnx.Rngs(1)), seed=1)
  save_reward_model(per_layer, str(tmp_path))
  # a file written before `scan_layers` existed has no such field: it loads scanned
  config_file = tmp_path / "reward_model_config.json"
  written = json.loads(config_file.read_text())
  assert written.pop("scan_layers") is False
  config_file.write_text(json.dumps(written))
  loaded = load_reward_model(str(tmp_path))
  assert loaded.cfg.scan_layers and isinstance(loaded.trunk.layers[0], LayerStack)
  tokens = jnp.asarray(np.random.default_rng(0).integers(1, 97, (2, 6)), jnp.int32)
  mask = jnp.ones_like(tokens)
  positions = jnp.cumsum(mask, 1) - 1
  want = per_layer(tokens, positions=positions, attention_mask=mask)
  got = loaded(tokens, positions=positions, attention_mask=mask)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)   # scan vs loop: other fusions
