"""Jit-compiled generation with a KV cache: prefill + `lax.while_loop` decode, per shape bucket.

Public entry points: `SamplingParams`, `generate(model, prompt_tokens, prompt_mask, *,
sampling, rng) -> Rollout`, `generate_rows` (rows already placed, e.g. across
processes), `compile_count()`, `precompile(sampler, *args, **kwargs)` (the program of
calls to come, from an abstract model); the token filters live in
`rljax.sampling.filters`.
"""

from rljax.host_memory import release_after_long_compiles
from rljax.sampling.buckets import compile_count, precompile
from rljax.sampling.filters import filter_logits, sample_tokens, truncated_log_softmax
from rljax.sampling.params import SamplingParams
from rljax.sampling.rollout import Rollout
from rljax.sampling.sampler import generate, generate_rows

# the sampler's and the trainer's big programs (the trainer imports this package): the
# memory their compilation freed goes back to the OS before their first run. Not at
# `import rljax`, which must not import JAX (a script may still set JAX's environment).
release_after_long_compiles()

__all__ = [
    "Rollout",
    "SamplingParams",
    "compile_count",
    "filter_logits",
    "generate",
    "generate_rows",
    "precompile",
    "sample_tokens",
    "truncated_log_softmax",
]
