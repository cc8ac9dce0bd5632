"""The code's shape, measured from its source: small modules (every module of rljax/) and
functions, one-way imports between the trainer's rooms, no private names across modules, and
the config read only where it is built into specs."""

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).parent.parent / "rljax"
TRAIN_ROOMS = ("config", "params", "rollout", "update", "run", "ablate")
# A room may import the rooms after it in this order, never one before it.
ROOM_ORDER = ("ablate", "run", "update", "rollout", "params", "config")
# The code that reads the ConfigDict: loading and validation, the spec and object builders,
# the command line (and `rljax eval`, which rebuilds a saved config).
CONFIG_READERS = ("train/config/", "train/run/build.py", "train/run/task_and_models.py",
                  "train/ablate/", "cli/", "analysis/")
# Function-level imports of rljax modules that must stay lazy: none.
MAX_MODULE_LINES = 300
MAX_FUNCTION_LINES = 50


def _modules():
  return sorted(p for p in ROOT.rglob("*.py"))


def _name(path):
  return ".".join(("rljax",) + path.relative_to(ROOT).with_suffix("").parts).removesuffix(
      ".__init__")


def _code_lines(node, source_lines):
  """Lines of a function's body that are code: no docstring, blank or comment lines."""
  body = node.body
  if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None),
                                                           ast.Constant):
    body = body[1:]
  if not body:
    return 0
  lines = source_lines[body[0].lineno - 1:node.end_lineno]
  return sum(1 for line in lines if line.strip() and not line.strip().startswith("#"))


def _functions(tree):
  for node in ast.walk(tree):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      yield node


def test_modules_are_small():
  """Every module of rljax/ (not only the trainer's) holds at most MAX_MODULE_LINES lines: a
  bigger one is split where its subject changes, its public names staying importable."""
  sizes = {str(p.relative_to(ROOT)): p.read_text().count("\n") for p in _modules()}
  too_big = {k: v for k, v in sizes.items() if v > MAX_MODULE_LINES}
  assert not too_big, too_big


def test_functions_are_short():
  long = {}
  for path in _modules():
    source = path.read_text()
    lines = source.splitlines()
    for fn in _functions(ast.parse(source)):
      n = _code_lines(fn, lines)
      if n > MAX_FUNCTION_LINES:
        long[f"{path.relative_to(ROOT)}:{fn.name}"] = n
  assert not long, long


def _imports(path):
  """(module imported, names, at function level) of every rljax import in `path`."""
  tree = ast.parse(path.read_text())
  nested = {id(n) for fn in _functions(tree) for n in ast.walk(fn)}
  out = []
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("rljax"):
      out.append((node.module, [a.name for a in node.names], id(node) in nested))
    elif isinstance(node, ast.Import):
      out += [(a.name, [], id(node) in nested) for a in node.names if a.name.startswith("rljax")]
  return out


def test_no_private_names_cross_modules():
  crossing = [f"{_name(p)} imports {n} from {m}" for p in _modules()
              for m, names, _ in _imports(p) for n in names
              if n.startswith("_") and not n.startswith("__")]
  assert not crossing, crossing


# the one allowed: the console script re-executes itself (huge pages) before JAX is imported
LAZY_BY_DESIGN = {"rljax.console: rljax.cli"}


def test_no_function_level_rljax_imports():
  lazy = [f"{_name(p)}: {m}" for p in _modules() for m, _, nested in _imports(p) if nested]
  assert set(lazy) <= LAZY_BY_DESIGN, sorted(set(lazy) - LAZY_BY_DESIGN)


def _room(module):
  parts = module.split(".")
  return parts[2] if len(parts) > 2 and parts[:2] == ["rljax", "train"] and \
      parts[2] in TRAIN_ROOMS else None


def test_trainer_rooms_import_one_way():
  backwards = []
  for path in (ROOT / "train").rglob("*.py"):
    here = _room(_name(path))
    for module, names, _ in _imports(path):
      for target in [module] + [f"{module}.{n}" for n in names]:
        there = _room(target)
        if here and there and ROOM_ORDER.index(there) < ROOM_ORDER.index(here):
          backwards.append(f"{_name(path)} -> {target}")
  assert not backwards, backwards


def _package_graph():
  graph = {}
  for path in _modules():
    src = _name(path).split(".")[1] if _name(path) != "rljax" else "rljax"
    for module, names, _ in _imports(path):
      dst = module.split(".")[1] if "." in module else None
      if dst is None and names:   # `from rljax import parallel`
        for n in names:
          graph.setdefault(src, set()).add(n)
      elif dst and dst != src:
        graph.setdefault(src, set()).add(dst)
  return graph


def test_no_package_cycles():
  graph = _package_graph()
  seen, stack, cycles = set(), [], []

  def visit(node):
    if node in stack:
      cycles.append(stack[stack.index(node):] + [node])
      return
    if node in seen:
      return
    seen.add(node)
    stack.append(node)
    for nxt in sorted(graph.get(node, ())):
      visit(nxt)
    stack.pop()

  for node in sorted(graph):
    visit(node)
  assert not cycles, cycles


CONFIG_READ = re.compile(r"\bconfig\.(run|model|task|sft|sampling|algo|optim|parallel)\b")


@pytest.mark.parametrize("room", ["params", "rollout", "update", "run"])
def test_the_config_ends_at_build(room):
  readers = []
  for path in (ROOT / "train" / room).rglob("*.py"):
    rel = str(path.relative_to(ROOT))
    if any(rel.startswith(allowed) for allowed in CONFIG_READERS):
      continue
    code = "\n".join(line.split("#")[0] for line in path.read_text().splitlines())
    readers += [f"{rel}: {m.group(0)}" for m in CONFIG_READ.finditer(code)]
  assert not readers, readers
