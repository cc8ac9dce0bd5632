"""Compiled programs reused across the runs of an ablation: JAX's persistent compilation
cache, with a count of what each run compiled and what it found compiled."""

from __future__ import annotations

import os
import pathlib

import jax
from jax import monitoring

_HIT = "/jax/compilation_cache/cache_hits"
_MISS = "/jax/compilation_cache/cache_misses"
_SAVED = "/jax/compilation_cache/compile_time_saved_sec"
_COMPILE = "/jax/core/compile/backend_compile_duration"


class CompileCounter:
  """Counts persistent-cache hits and misses, backend compile seconds and the compile
  seconds the cache saved, from JAX's monitoring events (listeners stay registered for the
  process; `snapshot()` differences give one run's counts)."""

  def __init__(self):
    self.totals = {"cache_hits": 0, "cache_misses": 0, "compile_s": 0.0, "saved_s": 0.0}
    monitoring.register_event_listener(self._event)
    monitoring.register_event_duration_secs_listener(self._duration)

  def _event(self, event, **kwargs):
    del kwargs
    if event == _HIT:
      self.totals["cache_hits"] += 1
    elif event == _MISS:
      self.totals["cache_misses"] += 1

  def _duration(self, event, duration, **kwargs):
    del kwargs
    if event == _COMPILE:
      self.totals["compile_s"] += duration
    elif event == _SAVED:
      self.totals["saved_s"] += duration

  def snapshot(self) -> dict:
    return dict(self.totals)

  @staticmethod
  def since(before: dict, after: dict) -> dict:
    return {k: after[k] - before[k] for k in after}


def enable_persistent_cache(directory) -> str:
  """Turns JAX's persistent compilation cache on in `directory` (every program, however
  quick to compile), unless the environment already chose one; returns the directory."""
  chosen = os.environ.get("JAX_COMPILATION_CACHE_DIR") or jax.config.jax_compilation_cache_dir
  if chosen:
    return chosen
  path = str(pathlib.Path(directory).absolute())
  jax.config.update("jax_compilation_cache_dir", path)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  return path
