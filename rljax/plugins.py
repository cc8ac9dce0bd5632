"""User code named in a config: `"package.module:name"` or `"path/to/file.py:name"`.

One loader for every config field that points at user code (`task.reward_fns`,
`task.python`, `task.env`), so the spelling, the search path and the errors are the same
everywhere. Errors name the config field and say what was not found.
"""

from __future__ import annotations

import importlib
import importlib.util
import pathlib
import sys


def load_object(spec: str, *, field: str):
  """The object `name` of a module or file.

  Args:
    spec: `"package.module:name"` (imported from sys.path, the working directory
      included) or `"path/to/file.py:name"` (a file, relative to the working directory).
      `name` may be dotted (`"module:Class.factory"`).
    field: the config field the spec came from, for error messages.
  Raises:
    ValueError: the spec has no `:name` part, the module or file does not exist, or it
      has no such attribute.
  """
  where, sep, name = str(spec).rpartition(":")
  if not sep or not where or not name:
    raise ValueError(f"{field}={spec!r}: expected 'package.module:name' or "
                     "'path/to/file.py:name'")
  module = _load_module(where, field=field, spec=spec)
  obj = module
  for part in name.split("."):
    if not hasattr(obj, part):
      public = sorted(k for k in vars(module) if not k.startswith("_"))
      raise ValueError(f"{field}={spec!r}: {where} has no attribute {name!r}; it defines "
                       f"{public[:20]}")
    obj = getattr(obj, part)
  return obj


def _load_module(where: str, *, field: str, spec: str):
  if where.endswith(".py") or "/" in where or "\\" in where:
    path = pathlib.Path(where)
    if not path.is_file():
      raise ValueError(f"{field}={spec!r}: file {path} not found (relative to {pathlib.Path.cwd()})")
    key = f"rljax_user_{path.stem}_{abs(hash(str(path.resolve())))}"
    if key in sys.modules:
      return sys.modules[key]
    module_spec = importlib.util.spec_from_file_location(key, path)
    if module_spec is None or module_spec.loader is None:
      raise ValueError(f"{field}={spec!r}: cannot import {path}")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[key] = module   # pickling and dataclasses look modules up by name
    try:
      module_spec.loader.exec_module(module)
    except BaseException:
      del sys.modules[key]
      raise
    return module
  if str(pathlib.Path.cwd()) not in sys.path and "" not in sys.path:
    sys.path.insert(0, str(pathlib.Path.cwd()))
  try:
    return importlib.import_module(where)
  except ModuleNotFoundError as e:
    raise ValueError(f"{field}={spec!r}: module {where!r} not found ({e})") from e
