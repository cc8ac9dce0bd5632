"""rljax: reinforcement-learning post-training of language models in JAX / Flax NNX."""

__version__ = "0.1.0"
