"""Every `rljax` name a benchmark imports exists: benchmarks import trainer internals inside
functions (so a script's --help stays fast), which no other test executes; a moved module
would otherwise surface only when someone runs the benchmark."""

import ast
import importlib
import pathlib

import pytest

BENCHMARKS = sorted((pathlib.Path(__file__).parent.parent / "benchmarks").glob("*.py"))


def _rljax_imports(path):
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("rljax"):
      for alias in node.names:
        yield node.module, alias.name, node.lineno
    elif isinstance(node, ast.Import):
      for alias in node.names:
        if alias.name.startswith("rljax"):
          yield alias.name, None, node.lineno


@pytest.mark.parametrize("path", BENCHMARKS, ids=lambda p: p.name)
def test_benchmark_imports_resolve(path):
  missing = []
  for module, name, line in _rljax_imports(path):
    try:
      mod = importlib.import_module(module)
    except ImportError as err:
      missing.append(f"line {line}: {module} ({err})")
      continue
    if name is not None and not hasattr(mod, name):
      try:
        importlib.import_module(f"{module}.{name}")
      except ImportError:
        missing.append(f"line {line}: {module}.{name}")
  assert not missing, f"{path.name}: " + "; ".join(missing)
