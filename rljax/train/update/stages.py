"""Feature tables: each optional step of a stage is declared once, beside the spec field that
turns it on, and the steps a run turns on are chosen once from its spec (`enabled`)."""

from __future__ import annotations

import dataclasses
import functools


@functools.cache
def enabled(spec, table: tuple) -> tuple:
  """The steps of `table` ((spec field, step) pairs, in order) whose field is set in `spec`
  (a frozen dataclass); a field the spec does not have is an error, not a silent "off"."""
  fields = {f.name for f in dataclasses.fields(spec)}
  unknown = [name for name, _ in table if name not in fields]
  if unknown:
    raise ValueError(f"{type(spec).__name__} has no field {unknown}")
  return tuple(step for name, step in table if getattr(spec, name))
