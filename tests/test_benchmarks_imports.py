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


def test_benchmarks_warn_when_rljax_comes_from_another_checkout(tmp_path):
  """The scripts put only benchmarks/ on the path, so `rljax` comes from wherever the venv's
  editable install points; a benchmark run from one checkout must say when it would time
  another's code."""
  sys.path.insert(0, str(BENCH))
  try:
    workload = importlib.import_module("workload")
  finally:
    sys.path.remove(str(BENCH))
  assert workload.rljax_checkout_warning() == ""   # the tests import this checkout's rljax
  other = tmp_path / "other_checkout" / "rljax" / "__init__.py"
  warning = workload.rljax_checkout_warning(str(other))
  assert warning.startswith("WARNING") and str(tmp_path / "other_checkout") in warning
  assert str(BENCH.parent.resolve()) in warning
