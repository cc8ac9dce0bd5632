"""Continuous batching and shared prefill give, request by request, what the static
sampler gives; compiles stay bounded."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tolerances import assert_close_f32

from rljax.models import Decoder
from rljax.models.testing import perturb_params, tiny_config
from rljax.parallel import make_mesh
from rljax.sampling import SamplingParams, compile_count, generate, slot_loop
from rljax.sampling.continuous import generate_continuous
from rljax.sampling.decode import shared_prefill


@pytest.fixture(scope="module")
def model():
  return perturb_params(Decoder(tiny_config(), rngs=nnx.Rngs(0)), scale=0.3)


def _prompts(b=5, p=7, seed=0):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(1, p + 1, b)
  mask = (np.arange(p)[None] >= p - lengths[:, None]).astype(np.int32)
  return (rng.integers(3, 97, (b, p)) * mask).astype(np.int32), mask


def _same(a, b, ulps=256):
  """Same tokens; log-probs up to rounding (other batch rows, caches and prefill programs)."""
  np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
  np.testing.assert_array_equal(np.asarray(a.mask), np.asarray(b.mask))
  np.testing.assert_array_equal(np.asarray(a.truncated), np.asarray(b.truncated))
  assert_close_f32(a.logp, b.logp, ulps=ulps)
  assert_close_f32(a.logp_full, b.logp_full, ulps=ulps)
  np.testing.assert_array_equal(np.asarray(a.group_id), np.asarray(b.group_id))


STOPS = SamplingParams(max_new_tokens=12, n=3, stop_tokens=(5, 7, 9, 11, 13))
FILTERS = SamplingParams(max_new_tokens=9, n=2, top_k=20, top_p=0.9, temperature=0.8,
                         stop_tokens=(5, 7, 9))
GREEDY = SamplingParams(max_new_tokens=8, n=1, greedy=True, stop_tokens=(5, 7))
ONE_TOKEN = SamplingParams(max_new_tokens=1, n=4, stop_tokens=(5,))


@pytest.mark.parametrize("sampling, slots, share", [
    (STOPS, 1, True), (STOPS, 4, False), (STOPS, 64, True), (FILTERS, 4, True),
    (GREEDY, 4, True), (ONE_TOKEN, 4, True),
], ids=["one_slot", "per_row_prefill", "all_resident", "filters", "greedy", "one_token"])
def test_continuous_equals_static_request_by_request(model, sampling, slots, share):
  tokens, mask = _prompts()
  static = generate(model, tokens, mask, sampling=sampling, rng=jax.random.key(3))
  _same(generate_continuous(model, tokens, mask, sampling=sampling, rng=jax.random.key(3),
                            slots=slots, share_prefill=share), static)


@pytest.mark.parametrize("shards, slots", [(2, 15), (8, 64)])
def test_sharded_over_a_mesh_equals_the_unsharded_static_sampler(model, shards, slots):
  """5 prompts x 3 samples over 2 / 8 batch shards: prompts are padded to whole groups per
  shard, slots rounded to a multiple of the shards; every request keeps its tokens."""
  mesh = make_mesh(data=shards, devices=jax.devices()[:shards])
  tokens, mask = _prompts()
  static = generate(model, tokens, mask, sampling=STOPS, rng=jax.random.key(3))
  out = generate_continuous(model, tokens, mask, sampling=STOPS, rng=jax.random.key(3),
                            slots=slots, mesh=mesh)
  assert len(out.tokens.sharding.device_set) == shards
  assert np.asarray(out.mask).sum(1).min() < STOPS.max_new_tokens   # stops happened
  _same(out, static)


def test_lengths_really_differ_and_slots_are_reused(model):
  tokens, mask = _prompts(b=6)
  sampling = SamplingParams(max_new_tokens=16, n=4, stop_tokens=tuple(range(5, 25)))
  out = generate_continuous(model, tokens, mask, sampling=sampling, rng=jax.random.key(0),
                            slots=3)
  lengths = np.asarray(out.mask).sum(1)
  assert lengths.min() < lengths.max() and len(lengths) == 24   # 24 requests through 3 slots


def test_shared_prefill_gives_the_same_cache_and_logits(model):
  tokens, mask = _prompts(b=3)
  n = 4
  rows_t, rows_m = np.repeat(tokens, n, 0), np.repeat(mask, n, 0)
  positions = jnp.maximum(jnp.cumsum(rows_m, 1) - 1, 0)
  fused = {"fused": model.fused_weights()}
  per_row = shared_prefill(model, jnp.asarray(rows_t), positions, jnp.asarray(rows_m), fused, 1)
  shared = shared_prefill(model, jnp.asarray(rows_t), positions, jnp.asarray(rows_m), fused, n)
  for a, b in zip(jax.tree.leaves(per_row), jax.tree.leaves(shared)):   # logits and caches
    assert_close_f32(a, b, ulps=256)   # one prefill per row vs one shared: other sums
  sampling = SamplingParams(max_new_tokens=10, n=n, stop_tokens=(5, 7))
  _same(generate(model, tokens, mask, sampling=sampling, rng=jax.random.key(2), share_prefill=True),
        generate(model, tokens, mask, sampling=sampling, rng=jax.random.key(2)))


def test_no_recompile_for_new_prompts_and_params_in_the_same_bucket(model):
  sampling = SamplingParams(max_new_tokens=6, n=2, stop_tokens=(5,))
  tokens, mask = _prompts(seed=1)
  generate_continuous(model, tokens, mask, sampling=sampling, rng=jax.random.key(0), slots=4)
  before = compile_count()
  other = perturb_params(nnx.clone(model), seed=9)
  tokens2, mask2 = _prompts(seed=2)
  generate_continuous(other, tokens2, mask2, sampling=sampling, rng=jax.random.key(1), slots=4)
  assert compile_count() == before


def _loops(jaxpr) -> list[int]:
  """The nesting depth of every `while` in a jaxpr (sub-jaxprs of loops, conds and calls
  included)."""
  out = []

  def walk(j, depth):
    for eqn in j.eqns:
      inner = depth + (eqn.primitive.name == "while")
      if eqn.primitive.name == "while":
        out.append(depth)
      for value in eqn.params.values():
        for sub in value if isinstance(value, tuple | list) else [value]:
          if isinstance(sub, jax.extend.core.ClosedJaxpr):
            walk(sub.jaxpr, inner)
          elif isinstance(sub, jax.extend.core.Jaxpr):
            walk(sub, inner)
  walk(jaxpr.jaxpr, 0)
  return out


@pytest.mark.parametrize("slots, want", [(8, [0, 0]), (2, [0, 1, 0, 1])],
                         ids=["resident", "queue"])
def test_resident_rows_compile_no_insert(model, slots, want):
  """Every row resident: nothing ever waits for a slot, so the program is the decode
  segments and the drain levels, with no insert loop (each with a prefill) in the drain
  (it made the compile's memory peak, 1,004 -> 865 MB at the toy shape); queued rows keep
  theirs. 4 prompts x 2 samples, 10 tokens: one decode segment and drain level 4
  (resident); the queue loop and the loop at its 2 slots once none waits, each with its
  insert loop (queue; no drain level below `MIN_DRAIN_SLOTS`)."""
  sampling = SamplingParams(max_new_tokens=10, n=2, stop_tokens=(5,))
  tokens, mask = _prompts(b=4)
  jaxpr = jax.make_jaxpr(lambda: generate_continuous(
      model, tokens, mask, sampling=sampling, rng=jax.random.key(0), slots=slots).tokens)()
  assert sorted(_loops(jaxpr)) == sorted(want)


@pytest.mark.parametrize("size, queued", [(s, q) for s in range(0, 70) for q in (False, True)])
def test_drain_sizes_halve_down_to_the_minimum(size, queued):
  """The loops after the resident phase, written out: the first at `size` (the queue's own
  loop always; a drain level only from MIN_DRAIN_SLOTS slots), then each half while it
  keeps MIN_DRAIN_SLOTS slots, DRAIN_LEVELS loops at most."""
  want, s = [], size
  if size >= 1 and (queued or size >= slot_loop.MIN_DRAIN_SLOTS):
    want.append(size)
    while len(want) < slot_loop.DRAIN_LEVELS and s // 2 >= slot_loop.MIN_DRAIN_SLOTS:
      s //= 2
      want.append(s)
  assert slot_loop.drain_sizes(size, queued=queued) == want
  if size == 64:
    assert want == [64, 32, 16, 8]
  if size == 4 and not queued:   # Qwen2.5-0.5B x 8 rows resident: one drain level
    assert want == [4]


@pytest.mark.parametrize("rows", [2, 3, 6])
def test_resident_rows_below_the_drain_minimum_decode_to_the_end(model, rows):
  """With fewer than 2 x MIN_DRAIN_SLOTS rows resident there is no drain level: the static
  decode runs until every row stops, and the rows are the static sampler's."""
  sampling = SamplingParams(max_new_tokens=12, stop_tokens=tuple(range(5, 60, 3)))
  tokens, mask = _prompts(b=rows)
  cont = generate_continuous(model, tokens, mask, sampling=sampling, rng=jax.random.key(3),
                             slots=rows)
  static = generate(model, tokens, mask, sampling=sampling, rng=jax.random.key(3))
  _same(cont, static)
  lengths = np.asarray(cont.mask).sum(1)
  assert len(set(lengths.tolist())) > 1, "the rows should stop apart"
