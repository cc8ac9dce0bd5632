"""`rljax.sampling.precompile`: the program of the calls to come, compiled from an abstract
model (before any parameter is resident), is the one those calls run: no second compile,
and the tokens a normally compiled program gives."""

import contextlib

import jax
import numpy as np
import pytest
from flax import nnx

from rljax.models import Decoder
from rljax.models.testing import tiny_config
from rljax.sampling import SamplingParams, compile_count, generate, precompile
from rljax.sampling import continuous as continuous_sampler
from rljax.sampling import sampler as static_sampler
from rljax.sampling.continuous import generate_continuous

SAMPLING = SamplingParams(max_new_tokens=10, n=2, temperature=0.9, stop_tokens=(5, 7))
CFG = tiny_config()   # scan_layers (the default, as `load_hf`'s): sampled through views
JITS = {"static": static_sampler._decode_jit, "continuous": continuous_sampler._continuous_jit}


def _static(model, tokens, mask, seed=0):
  return generate(model, tokens, mask, sampling=SAMPLING, rng=jax.random.key(seed))


def _continuous(model, tokens, mask, seed=0):   # every row resident, as the trainer's
  return generate_continuous(model, tokens, mask, sampling=SAMPLING, rng=jax.random.key(seed),
                             slots=SAMPLING.n * tokens.shape[0])


SAMPLERS = {"static": _static, "continuous": _continuous}


@contextlib.contextmanager
def _backend_compiles():
  """The names of the programs XLA compiles inside the block."""
  names = []

  def listen(event, _seconds, fun_name=None, **_):
    if event == "/jax/core/compile/backend_compile_duration":
      names.append(fun_name)
  jax.monitoring.register_event_duration_secs_listener(listen)
  try:
    yield names
  finally:
    jax.monitoring.unregister_event_duration_listener(listen)


def _prompts(b=3, p=6, seed=0):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(1, p + 1, b)
  mask = (np.arange(p)[None] >= p - lengths[:, None]).astype(np.int32)
  return (rng.integers(3, CFG.vocab_size, (b, p)) * mask).astype(np.int32), mask


@pytest.mark.parametrize("which", ["static", "continuous"])
def test_compiled_ahead_from_an_abstract_model_is_the_program_the_call_runs(which):
  sample, jitted = SAMPLERS[which], JITS[which]
  jitted.clear_cache()
  tokens, mask = _prompts()
  abstract = nnx.eval_shape(lambda: Decoder(CFG, rngs=nnx.Rngs(0)))
  assert all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(nnx.state(abstract)))
  with _backend_compiles() as names:
    assert precompile(sample, abstract, tokens, mask) == 1
  assert names.count(f"jit(_{'decode' if which == 'static' else which})") == 1, names
  model = Decoder(CFG, rngs=nnx.Rngs(1))
  other_tokens, other_mask = _prompts(seed=1)   # other values, same shapes and bucket
  traced = compile_count()
  with _backend_compiles() as names:
    ahead = sample(model, other_tokens, other_mask)
    assert precompile(sample, abstract, tokens, mask) == 0
  assert compile_count() == traced and not [n for n in names if "_decode" in n
                                            or "_continuous" in n], names
  jitted.clear_cache()   # the same call, compiled the ordinary way
  fresh = sample(model, other_tokens, other_mask)
  assert compile_count() == traced + 1
  for field in ("tokens", "mask", "logp", "logp_full", "truncated"):
    np.testing.assert_array_equal(getattr(ahead, field), getattr(fresh, field), err_msg=field)
  assert 0 < int(ahead.mask.sum()) < ahead.mask.size   # some rows stopped, some did not


def test_compiled_ahead_in_another_dtype():
  """A sampler dtype casts the abstract parameters as it casts concrete ones."""
  tokens, mask = _prompts()
  abstract = nnx.eval_shape(lambda: Decoder(CFG, rngs=nnx.Rngs(0)))

  def sample(model):
    return generate(model, tokens, mask, sampling=SAMPLING, rng=jax.random.key(0),
                    sampler_dtype="bfloat16")
  assert precompile(sample, abstract) == 1
  traced = compile_count()
  out = sample(Decoder(CFG, rngs=nnx.Rngs(1)))
  assert compile_count() == traced
  assert out.tokens.shape == (2 * tokens.shape[0], SAMPLING.max_new_tokens)
