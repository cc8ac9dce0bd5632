"""The optimizer state lives where the parameters do: Adam's moments sharded like them."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rljax import parallel
from rljax.models import Decoder, ModelConfig
from rljax.train.params import init_optimizer_state, make_optimizer, place_state


def _device0_bytes(tree):
  """Bytes of `tree`'s arrays held by the first device of their sharding."""
  total = 0
  for x in jax.tree.leaves(tree):
    shard = x.addressable_shards[0]
    total += shard.data.nbytes
  return total


def test_adam_moments_are_sharded_like_the_parameters():
  mesh = parallel.make_mesh(data=1, fsdp=4, tensor=1, devices=jax.devices()[:4])
  cfg = ModelConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_layers=2,
                    num_heads=4, num_kv_heads=2)
  params = nnx.state(parallel.shard_model(Decoder(cfg, rngs=nnx.Rngs(0)), mesh))
  tx = make_optimizer(1e-3, warmup_steps=1, weight_decay=0.0, b1=0.9, b2=0.99, grad_clip=1.0)
  opt = place_state(init_optimizer_state(tx, params), mesh)
  # mu and nu: two copies of the parameters, each held a quarter per device like them
  # (before, jit put them on one device and placement replicated them: 8x the bytes)
  per_device, whole = _device0_bytes(opt), sum(x.nbytes for x in jax.tree.leaves(params))
  assert abs(per_device - 2 * _device0_bytes(params)) < 1024
  assert per_device < 0.6 * whole
  mu = opt[1][0].mu
  for m, p in zip(jax.tree.leaves(mu), jax.tree.leaves(params)):
    assert m.sharding == p.sharding
    np.testing.assert_array_equal(np.asarray(m), 0.0)


def test_unsharded_parameters_keep_jit_placement():
  tx = make_optimizer(1e-3, warmup_steps=1, weight_decay=0.0, b1=0.9, b2=0.99, grad_clip=0.0)
  opt = init_optimizer_state(tx, {"w": jnp.ones((3, 2))})
  assert jax.tree.leaves(opt)[1].shape == (3, 2)
