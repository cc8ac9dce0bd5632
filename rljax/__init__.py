"""rljax: reinforcement-learning post-training of language models in JAX / Flax NNX."""

from rljax.host_memory import keep_freed_host_memory_if_cpu

__version__ = "0.1.0"

# before JAX starts its backend: on a CPU-only JAX, XLA's temporaries in blocks glibc keeps
keep_freed_host_memory_if_cpu()
