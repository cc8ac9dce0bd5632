"""Every name a benchmark imports exists, from rljax and from the sibling scripts of
benchmarks/ (`workload`, `sampler_vs_hf`, ...): benchmarks import trainer internals inside
functions (so a script's --help stays fast), which no other test executes; a moved module
or a removed helper (`matmul_gflops`, once) would otherwise surface only when someone runs
the benchmark."""

import ast
import importlib
import pathlib
import sys

import pytest

BENCH = pathlib.Path(__file__).parent.parent / "benchmarks"
BENCHMARKS = sorted(BENCH.glob("*.py"))
SIBLINGS = {p.stem for p in BENCHMARKS}


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


def _sibling_imports(path):
  """(sibling module, name or None, line) of every import of another benchmarks/ script,
  at module level or inside a function."""
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.ImportFrom) and node.module in SIBLINGS and not node.level:
      for alias in node.names:
        yield node.module, alias.name, node.lineno
    elif isinstance(node, ast.Import):
      for alias in node.names:
        if alias.name in SIBLINGS:
          yield alias.name, None, node.lineno


def test_some_benchmarks_import_siblings():
  """The check below has something to check (workload's helpers are shared)."""
  assert {m for p in BENCHMARKS for m, _, _ in _sibling_imports(p)} >= {"workload",
                                                                       "grpo_vs_trl"}


@pytest.mark.parametrize("path", BENCHMARKS, ids=lambda p: p.name)
def test_benchmark_sibling_imports_resolve(path, monkeypatch):
  monkeypatch.syspath_prepend(str(BENCH))
  missing = []
  for module, name, line in _sibling_imports(path):
    mod = sys.modules.get(module) or importlib.import_module(module)
    if name is not None and not hasattr(mod, name):
      missing.append(f"line {line}: {module}.{name}")
  assert not missing, f"{path.name}: " + "; ".join(missing)
