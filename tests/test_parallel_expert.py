"""Expert parallelism on 8 simulated CPU devices: the MoE block with its experts split over an
"expert" mesh axis (jit's sharding propagation, and shard_map with all-gather or all-to-all
dispatch) equals the unsharded block, values and gradients."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from tolerances import assert_close_f32

from rljax.models import ModelConfig
from rljax.models.moe import MoEMLP, grouped_swiglu
from rljax.parallel import make_mesh, shard_model
from rljax.parallel.expert import expert_parallel

D, E, K = 16, 8, 2
CFG = ModelConfig(vocab_size=11, hidden_size=D, intermediate_size=24, num_layers=1,
                  num_heads=2, num_experts=E, num_experts_per_tok=K, moe_intermediate_size=8,
                  norm_topk_prob=True, shared_expert_intermediate_size=12)


def _block():
  block = MoEMLP(CFG, rngs=nnx.Rngs(0))
  rng = np.random.default_rng(0)
  nnx.update(block, jax.tree.map(lambda x: jnp.asarray(0.3 * rng.standard_normal(x.shape),
                                                       x.dtype), nnx.state(block, nnx.Param)))
  return block


def _loss_and_grads(block, x, cot, experts):
  graphdef, state = nnx.split(block)

  def loss(state, x):
    y, routing = nnx.merge(graphdef, state)(x, experts=experts)
    return jnp.sum(y * cot), (y, routing.expert_ids)

  (_, (y, ids)), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(
      state, x)
  return y, ids, grads


def _assert_same(got, want):
  y, ids, (g_state, g_x) = got
  y_ref, ids_ref, (g_state_ref, g_x_ref) = want
  np.testing.assert_array_equal(ids, ids_ref)
  assert_close_f32(y, y_ref, ulps=64)   # 64: other reduction orders (sums over devices)
  assert_close_f32(g_x, g_x_ref, ulps=64)
  ref = dict(nnx.to_flat_state(g_state_ref))
  for path, v in nnx.to_flat_state(g_state):
    assert_close_f32(v[...], ref[path][...], ulps=64, err_msg=str(path))


def test_expert_mesh_and_placement():
  mesh = make_mesh(data=2, expert=4)
  assert dict(mesh.shape) == {"data": 2, "fsdp": 1, "expert": 4, "tensor": 1}
  block = shard_model(_block(), mesh)
  assert block.gate[...].sharding.spec == P("expert", None, None)
  assert {s.data.shape for s in block.down[...].addressable_shards} == {(E // 4, 8, D)}
  assert block.router[...].sharding.is_fully_replicated
  plain = shard_model(_block(), make_mesh(data=-1, fsdp=4))   # no expert axis: replicated
  assert plain.gate[...].sharding.spec == P(None, "fsdp", None)
  with pytest.raises(ValueError, match="expert=3"):
    make_mesh(expert=3)


@pytest.mark.parametrize("dispatch", ["jit", "all_gather", "all_to_all"])
def test_expert_parallel_equals_unsharded(dispatch):
  x = jax.random.normal(jax.random.key(1), (8, 4, D))
  cot = jax.random.normal(jax.random.key(2), x.shape)
  want = _loss_and_grads(_block(), x, cot, grouped_swiglu)
  mesh = make_mesh(data=2, expert=4)
  block = shard_model(_block(), mesh)
  x_sharded = jax.device_put(x, NamedSharding(mesh, P(("data", "expert"))))
  experts = grouped_swiglu if dispatch == "jit" else functools.partial(
      expert_parallel, grouped_swiglu, mesh=mesh, dispatch=dispatch)
  got = _loss_and_grads(block, x_sharded, cot, experts)
  counts = np.bincount(np.asarray(got[1]).ravel(), minlength=E)
  assert np.count_nonzero(counts) >= 6   # tokens reach most experts, on every device
  _assert_same(got, want)


def test_expert_parallel_errors():
  block = _block()
  x = jnp.zeros((8, D))
  with pytest.raises(ValueError, match="'expert' axis"):
    expert_parallel(grouped_swiglu, x, jnp.zeros((8, K), jnp.int32), jnp.zeros((8, K)),
                    *block.expert_weights(), mesh=make_mesh())
  with pytest.raises(ValueError, match="all_to_all"):
    expert_parallel(grouped_swiglu, x, jnp.zeros((8, K), jnp.int32), jnp.zeros((8, K)),
                    *block.expert_weights(), mesh=make_mesh(expert=8), dispatch="ragged")
