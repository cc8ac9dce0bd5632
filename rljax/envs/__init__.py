"""Environments for multi-turn rollouts: the model acts, the environment answers.

The protocol (stable; external checks rely on these names):

    @dataclasses.dataclass
    class Step:
      observation: str = ""   # text appended after the model's action (masked from the loss)
      reward: float = 0.0     # step reward (summed into the episode score unless per-step rewards)
      done: bool = False
      info: dict = {}         # "tool_call" / "error" flags feed tools/* metrics

    class Env(Protocol):
      def reset(self, prompt) -> str: ...       # first observation after the prompt ("" for none)
      def step(self, action: str) -> Step: ...  # action = the model's text of this turn

A run names a factory with `task.env = "module.path:factory"` or `"path/to/file.py:factory"`;
the factory takes the prompt (`rljax.data.Prompt`) and returns one `Env` per episode. The
rollout (`rljax.sampling.multiturn`) keeps each row's KV cache across turns and appends
the observation's token ids to it, so the trainer trains on exactly the ids the sampler saw.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol, runtime_checkable

from rljax.plugins import load_object

# How an episode ended (first-class: counted, and `algo.on_truncated_episode` decides what
# each one means for the loss).
STATUSES = ("done", "max_turns", "length", "env_error", "env_timeout")


@dataclasses.dataclass
class Step:
  """What the environment returns for one action."""

  observation: str = ""
  reward: float = 0.0
  done: bool = False
  info: dict = dataclasses.field(default_factory=dict)


@runtime_checkable
class Env(Protocol):
  """One episode's environment."""

  def reset(self, prompt) -> str: ...

  def step(self, action: str) -> Step: ...


def load_env_factory(spec: str):
  """The callable `task.env` names (`"module:factory"` or `"file.py:factory"`)."""
  factory = load_object(spec, field="task.env")
  if not callable(factory):
    raise ValueError(f"task.env={spec!r} is a {type(factory).__name__}, not a factory")
  return factory


__all__ = ["STATUSES", "Env", "Step", "load_env_factory"]
