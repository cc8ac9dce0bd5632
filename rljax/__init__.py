"""rljax: reinforcement-learning post-training of language models in JAX / Flax NNX."""

from rljax.host_memory import keep_freed_host_memory_if_asked

__version__ = "0.1.0"

# RLJAX_KEEP_FREED_MEMORY=1: before JAX starts its backend (`rljax.host_memory`)
keep_freed_host_memory_if_asked()
