"""`rljax.train.loop.train`: the stable import path of the training loop
(`rljax.train.run.loop`)."""

from rljax.train.run.loop import train

__all__ = ["train"]
