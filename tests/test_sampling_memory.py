"""The sampler's memory: a scanned model's layers read as views, no copy of the weights."""

import weakref

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rljax.models import Decoder, ModelConfig
from rljax.models.stack_layout import per_layer_layout, per_layer_views
from rljax.sampling import SamplingParams, decode, generate
from rljax.sampling import sampler as static_sampler
from rljax.sampling.decode import spec_and_scalars
from rljax.sampling.prepare import drop_sampling_copies, split_for_sampling
from rljax.sampling.streams import default_streams

# the weights dominate the program: 4 layers of a wide MLP, a short generation
CFG = ModelConfig(vocab_size=96, hidden_size=64, intermediate_size=2048, num_layers=4,
                  num_heads=4, num_kv_heads=2, head_dim=16)
B, P, T = 2, 4, 6


def _model(scan_layers=True):
  return Decoder(CFG.replace(scan_layers=scan_layers), rngs=nnx.Rngs(0))


def _prompts():
  tokens = np.random.default_rng(0).integers(1, CFG.vocab_size, (B, P)).astype(np.int32)
  return tokens, np.ones_like(tokens)


def test_views_share_the_stacked_memory():
  state = nnx.state(_model())
  views = per_layer_views(state)
  copies = per_layer_layout(state)
  assert jax.tree.structure(views) == jax.tree.structure(copies)
  gate = state["layers"][0]["layer"]["mlp"]["gate"].get_raw_value()
  for j in range(CFG.num_layers):
    view = views["layers"][j]["mlp"]["gate"].get_raw_value()
    assert view.unsafe_buffer_pointer() == gate.unsafe_buffer_pointer() + j * view.nbytes
  for a, b in zip(jax.tree.leaves(views), jax.tree.leaves(copies), strict=True):
    np.testing.assert_array_equal(a, b)


def test_sampler_program_holds_no_copy_of_the_weights(monkeypatch):
  """XLA's temporaries of the static sampler's program on a scanned model whose fused
  q|k|v and gate|up would exceed `FUSE_MAX_BYTES` (lowered to 1 MB here, as a 0.5B
  model's are): a few rows' activations, caches and logits, not a layer's weights (each
  layer's MLP: 1.5 MB)."""
  monkeypatch.setattr(decode, "FUSE_MAX_BYTES", 2 ** 20)
  model = _model()
  tokens, mask = _prompts()
  sampling = SamplingParams(max_new_tokens=T, temperature=1.0)
  spec, scalars = spec_and_scalars(sampling, 0)
  graphdef, state, _ = split_for_sampling(model, None, layer_views=True)
  compiled = static_sampler._decode_jit.lower(
      graphdef, state, jnp.asarray(tokens), jnp.asarray(mask), default_streams(B, 1),
      jax.random.key(0), scalars, spec=spec).compile()
  analysis = compiled.memory_analysis()
  layer_mlp = 3 * CFG.hidden_size * CFG.intermediate_size * 4
  assert analysis.argument_size_in_bytes > CFG.num_layers * layer_mlp
  assert analysis.temp_size_in_bytes < layer_mlp / 4, analysis.temp_size_in_bytes


def test_scanned_and_per_layer_models_sample_the_same():
  scanned, per_layer = _model(True), _model(False)
  tokens, mask = _prompts()
  sampling = SamplingParams(max_new_tokens=T, temperature=1.0)
  a = generate(scanned, tokens, mask, sampling=sampling, rng=jax.random.key(3))
  b = generate(per_layer, tokens, mask, sampling=sampling, rng=jax.random.key(3))
  np.testing.assert_array_equal(a.tokens, b.tokens)
  np.testing.assert_array_equal(a.logp, b.logp)


def test_no_hold_on_the_parameters_outlives_drop_sampling_copies(monkeypatch):
  """A view reads the stacked parameters through a host array (`np.from_dlpack`), which
  holds their buffers; deleting the view releases it on a runtime thread, and JAX applies
  that to the Python object at its next garbage collection. `drop_sampling_copies` waits
  for it: before, the host arrays were alive after each of these calls (and a donating
  update copies the parameters while they are: at Qwen2.5-0.5B 1.4 GB more at its peak, in
  the iterations where no collection ran in between). Then an update writes in place."""
  from rljax.models import stack_layout
  hosts, from_dlpack = [], np.from_dlpack

  def recording(x):
    out = from_dlpack(x)
    hosts.append(weakref.ref(out))
    return out

  monkeypatch.setattr(stack_layout.np, "from_dlpack", recording)
  model = _model()
  program = jax.jit(lambda state: sum(jnp.sum(x) for x in jax.tree.leaves(state)))
  alive = []
  for _ in range(10):
    hosts.clear()
    _, state, made = split_for_sampling(model, None, layer_views=True)
    drop_sampling_copies(made, program(state))
    alive.append(sum(h() is not None for h in hosts))
  assert len(hosts) == 9 and not any(alive), alive   # 9 stacked parameters
  step = jax.jit(lambda state: jax.tree.map(lambda x: x + 1, state), donate_argnums=0)
  state = nnx.state(model)
  before = [x.unsafe_buffer_pointer() for x in jax.tree.leaves(state)]
  assert [x.unsafe_buffer_pointer() for x in jax.tree.leaves(step(state))] == before


def test_the_call_deletes_the_views_it_made_and_keeps_the_models_arrays(monkeypatch):
  """Deleted when the call returns, not when Python drops them: a view alive at the next
  update makes it copy the stacked parameters (at Qwen2.5-0.5B: 1.4 GB, in some iterations
  only)."""
  from rljax.sampling import buckets
  from rljax.sampling.continuous import generate_continuous
  seen, call = [], buckets.call_releasing

  def recording(fn, graphdef, state, *args, **kwargs):
    seen.append(state)
    return call(fn, graphdef, state, *args, **kwargs)

  monkeypatch.setattr(buckets, "call_releasing", recording)
  model = _model()
  own = jax.tree.leaves(nnx.state(model))
  tokens, mask = _prompts()
  sampling = SamplingParams(max_new_tokens=T)
  generate(model, tokens, mask, sampling=sampling, rng=jax.random.key(0))
  generate_continuous(model, tokens, mask, sampling=sampling, rng=jax.random.key(0), slots=B)
  assert len(seen) == 2
  for state in seen:
    views = jax.tree.leaves(state)
    assert len(views) > len(own)   # one per layer of each stacked parameter
    assert all(v.is_deleted() for v in views if all(v is not x for x in own))
  assert not any(x.is_deleted() for x in own)
  out = generate(model, tokens, mask, sampling=sampling, rng=jax.random.key(0))  # still usable
  assert np.asarray(out.mask).sum() > 0
