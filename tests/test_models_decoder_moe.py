"""A decoder with mixture-of-experts layers: dense and MoE runs as separate stacks, scanned ==
per-layer, the routing of every MoE layer out of the full and the cached forwards, replay."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from flax import nnx
from tolerances import assert_close_f32

from rljax.models import Decoder
from rljax.models.logprobs import token_logprobs
from rljax.models.stack import (
  LayerStack,
  checkpoint_layout,
  per_layer_layout,
  restore_in_layout,
  stack_like,
)
from rljax.models.testing import perturb_params, tiny_moe_config

K = 2


def _pair(seed=0, **overrides):
  """(scanned, per-layer) MoE decoders with the same (perturbed) parameters."""
  cfg = tiny_moe_config(**overrides)
  looped = perturb_params(Decoder(cfg.replace(scan_layers=False), rngs=nnx.Rngs(seed)),
                          seed=seed)
  scanned = Decoder(cfg, rngs=nnx.Rngs(seed))
  nnx.update(scanned, stack_like(nnx.state(looped), nnx.state(scanned)))
  return scanned, looped


def _batch(seed=3, b=3, p=5, t=4, vocab=97):
  rng = np.random.default_rng(seed)
  lengths = np.array([p, p - 2, 1])[:b]
  prompt_mask = (np.arange(p)[None] >= p - lengths[:, None]).astype(np.int32)
  mask = np.concatenate([prompt_mask, np.ones((b, t), np.int32)], axis=1)
  tokens = rng.integers(0, vocab, size=(b, p + t)).astype(np.int32) * mask
  positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
  return jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(mask)


def test_dense_and_moe_runs_are_separate_stacks():
  cfg = tiny_moe_config(num_layers=5, decoder_sparse_step=2, mlp_only_layers=())
  model = Decoder(cfg, rngs=nnx.Rngs(0))   # MoE layers 1 and 3
  assert [(b.count, b.layer.moe) for b in model.layers] == [
      (1, False), (1, True), (1, False), (1, True), (1, False)]
  model = Decoder(tiny_moe_config(), rngs=nnx.Rngs(0))   # layer 0 dense, 1..3 MoE
  assert all(isinstance(b, LayerStack) for b in model.layers)
  assert [(b.count, b.layer.moe) for b in model.layers] == [(1, False), (3, True)]
  assert model.num_moe_layers == 3
  assert model.layers[1].layer.mlp.gate.get_metadata()["out_sharding"] == (
      "layers", "expert", "embed", "mlp")
  looped = Decoder(tiny_moe_config(scan_layers=False), rngs=nnx.Rngs(0))
  assert [layer.moe for layer in looped.layers] == [False, True, True, True]


@pytest.mark.parametrize("remat", [False, True])
def test_scanned_and_per_layer_moe_decoders_give_equal_logits_routes_and_gradients(remat):
  scanned, looped = _pair(seed=1, remat=remat)
  tokens, positions, mask = _batch()

  def value_and_grad(model):
    graphdef, state = nnx.split(model)

    def loss(state):
      m = nnx.merge(graphdef, state)
      logp = token_logprobs(m, tokens, positions, mask, prompt_len=5, chunk_size=3)
      return jnp.sum(logp), m.routed(tokens, positions=positions, attention_mask=mask)
    return jax.jit(jax.value_and_grad(loss, has_aux=True))(state)

  (want_loss, (want_logits, want_r)), want_grad = value_and_grad(looped)
  (got_loss, (got_logits, got_r)), got_grad = value_and_grad(scanned)
  assert got_r.expert_ids.shape == (3, 3, 9, K) and got_r.router_logits.shape == (3, 3, 9, 4)
  np.testing.assert_array_equal(got_r.own_ids, want_r.own_ids)
  assert_close_f32(got_logits, want_logits, ulps=256)   # scan vs loop: other fusions
  assert_close_f32(got_loss, want_loss, ulps=256, scale=np.abs(np.asarray(want_loss)) + 1)
  want_leaves = jax.tree.leaves(want_grad)
  got_leaves = jax.tree.leaves(per_layer_layout(got_grad))
  assert len(got_leaves) == len(want_leaves)
  g_max = max(float(np.abs(np.asarray(g)).max()) for g in want_leaves)
  for a, b in zip(got_leaves, want_leaves):
    assert_close_f32(a, b, ulps=256, scale=g_max)
  router = [np.asarray(g) for (path, g) in jax.tree_util.tree_flatten_with_path(got_grad)[0]
            if "router" in jax.tree_util.keystr(path)]
  assert router and float(np.abs(router[0]).max()) > 0   # the router trains


@pytest.mark.parametrize("scan", [True, False])
def test_replay_of_own_routes_is_bit_identical_and_other_routes_change_the_logits(scan):
  model = _pair(seed=2)[0 if scan else 1]
  tokens, positions, mask = _batch(seed=4)
  run = nnx.jit(lambda m, replay: m.routed(tokens, positions=positions, attention_mask=mask,
                                           replay_ids=replay))
  logits, routing = run(model, None)
  np.testing.assert_array_equal(routing.expert_ids, routing.own_ids)
  replayed, routing_r = run(model, routing.own_ids.astype(jnp.uint8))
  np.testing.assert_array_equal(replayed, logits)
  other = (routing.own_ids + 1) % 4
  changed, routing_o = run(model, other)
  np.testing.assert_array_equal(routing_o.expert_ids, other)
  # the first MoE layer's router sees the same input: its own choice is unchanged
  np.testing.assert_array_equal(routing_o.own_ids[0], routing.own_ids[0])
  assert float(jnp.max(jnp.abs(changed - logits))) > 1e-3
  # a missing route (ids >= E, the sampler's sentinel) keeps the router's own choice
  missing = jnp.full_like(other, 255).astype(jnp.uint8)
  np.testing.assert_array_equal(run(model, missing)[0], logits)
  # __call__ with replay_ids is routed()'s logits
  np.testing.assert_array_equal(
      nnx.jit(lambda m: m(tokens, positions=positions, attention_mask=mask,
                          replay_ids=other))(model), changed)


@functools.partial(nnx.jit, static_argnames=("p", "fused"))
def _prefill_and_decode(model, tokens, positions, mask, p, fused):
  """Prefill the first p columns, then one token at a time; the routing of every column."""
  b, s = tokens.shape
  cache = model.init_cache(b, s)
  kw = dict(fused=model.fused_weights()) if fused else {}
  _, cache, first = model.forward_cached_routed(
      tokens[:, :p], positions=positions[:, :p], cache=cache, start=0,
      kv_mask=jnp.concatenate([mask[:, :p], jnp.zeros_like(mask[:, p:])], 1), **kw)
  logits, ids = [], [first.own_ids]
  for j in range(p, s):
    step_logits, cache, r = model.forward_cached_routed(
        tokens[:, j:j + 1], positions=positions[:, j:j + 1], cache=cache, start=j,
        kv_mask=jnp.concatenate([mask[:, :j + 1], jnp.zeros_like(mask[:, j + 1:])], 1), **kw)
    logits.append(step_logits)
    ids.append(r.own_ids)
  return jnp.concatenate(logits, 1), jnp.concatenate(ids, axis=2)


@pytest.mark.parametrize("fused", [False, True])
def test_cached_forward_records_the_full_forwards_routes(fused):
  model, _ = _pair(seed=5)
  tokens, positions, mask = _batch(seed=6)
  full, routing = nnx.jit(lambda m: m.routed(tokens, positions=positions,
                                             attention_mask=mask))(model)
  logits, ids = _prefill_and_decode(model, tokens, positions, mask, 5, fused)
  assert ids.shape == routing.own_ids.shape == (3, 3, 9, K)
  real = np.asarray(mask, bool)   # padding positions route garbage in both
  np.testing.assert_array_equal(np.asarray(ids)[:, real], np.asarray(routing.own_ids)[:, real])
  assert_close_f32(logits, full[:, 5:], ulps=256)   # cached vs full: other matmul splits


def test_dense_decoder_has_no_routing():
  model = Decoder(tiny_moe_config(num_experts=0, mlp_only_layers=()), rngs=nnx.Rngs(0))
  tokens, positions, mask = _batch()
  logits, routing = model.routed(tokens, positions=positions, attention_mask=mask)
  assert routing is None and model.num_moe_layers == 0 and len(model.layers) == 1
  np.testing.assert_array_equal(logits, model(tokens, positions=positions, attention_mask=mask))


@pytest.mark.parametrize("saved_scanned", [False, True])
def test_a_moe_checkpoint_restores_into_either_layout(tmp_path, saved_scanned):
  """A scanned MoE decoder holds two stacks (dense, MoE): its checkpoint restores per layer
  and a per-layer one restores into the two stacks (runs of identical layers); the
  optimizer's moments convert alike."""
  scanned, looped = _pair(seed=7)
  per_layer = per_layer_layout(nnx.state(scanned))
  jax.tree.map(np.testing.assert_array_equal, per_layer, nnx.state(looped))
  tx = optax.adam(1e-3)
  opt = tx.init(nnx.state(scanned, nnx.Param))
  back = stack_like(per_layer_layout(opt), opt)
  jax.tree.map(np.testing.assert_array_equal, back, opt)
  saved, other = (scanned, looped) if saved_scanned else (looped, scanned)
  with ocp.StandardCheckpointer() as ckpt:
    ckpt.save(tmp_path / "ckpt", nnx.state(saved))
  target = jax.tree.map(ocp.utils.to_shape_dtype_struct, nnx.state(other))
  with ocp.StandardCheckpointer() as ckpt:
    tree = ckpt.metadata(tmp_path / "ckpt").item_metadata
    assert jax.tree.structure(checkpoint_layout(tree, target)[0]) != jax.tree.structure(target)
    out = restore_in_layout(lambda t: ckpt.restore(tmp_path / "ckpt", t), tree, target)
  jax.tree.map(np.testing.assert_array_equal, out, nnx.state(other))
