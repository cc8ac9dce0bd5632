"""Feature tables: each optional step of a stage is declared once, beside the spec field that
turns it on, and the steps a run turns on are chosen once from its spec (`enabled`)."""

from __future__ import annotations

import dataclasses
import functools


def _is_on(value) -> bool:
  """A field's value turns its step on unless it is falsy or "none" (the config's off)."""
  return bool(value) and not (isinstance(value, str) and value == "none")


@functools.cache
def enabled(spec, table: tuple) -> tuple:
  """The steps of `table` ((spec field, step) pairs, in order) whose field is set in `spec`
  (a frozen dataclass): not 0, False, empty or "none". A field the spec does not have is an
  error, not a silent "off"."""
  fields = {f.name for f in dataclasses.fields(spec)}
  unknown = [name for name, _ in table if name not in fields]
  if unknown:
    raise ValueError(f"{type(spec).__name__} has no field {unknown}")
  return tuple(step for name, step in table if _is_on(getattr(spec, name)))
