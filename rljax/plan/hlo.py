"""Reading a compiled program's optimized HLO text: its collectives, its largest arrays,
and the TPU compiler's out-of-memory report.

The optimized HLO is per device (after SPMD partitioning), so every shape here is one
device's. A collective inside a loop body is counted once per iteration when the compiler
knows the trip count (`known_trip_count`, e.g. the update step's `lax.scan` over
micro-batches), else once.
"""

from __future__ import annotations

import math
import re

_DTYPE_BYTES = {"pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "s16": 2, "u16": 2,
                "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8,
                "f64": 8, "c64": 8, "c128": 16}
_SHAPE = re.compile(r"\b(pred|[suf]\d+|bf16|c\d+|f8\w*)\[([\d,]*)\]")
_HEADER = re.compile(r"^(ENTRY )?%?([\w.\-]+) \(.*\) -> .*\{\s*$")
_INSTR = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = (.+?) ([\w\-]+)\((.*)$")
_CALLED = re.compile(r"\b(calls|body|condition|branch_computations|true_computation|"
                     r"false_computation|called_computations)=(\{[^}]*\}|%?[\w.\-]+)")
_REFERS = re.compile(r"\b(?:calls|body|condition|branch_computations|true_computation|"
                     r"false_computation|called_computations|to_apply)=(\{[^}]*\}|%?[\w.\-]+)")
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"')
_OP_NAME = re.compile(r'op_name="([^"]*)"')
COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute",
               "ragged-all-to-all")
_NOT_BUFFERS = ("parameter", "get-tuple-element", "tuple", "bitcast", "constant")


def shape_bytes(text: str) -> list[float]:
  """Bytes of every array shape in `text` (e.g. an HLO result type, tuples flattened)."""
  out = []
  for dtype, dims in _SHAPE.findall(text):
    size = _DTYPE_BYTES.get(dtype, 1)
    out.append(size * math.prod(int(d) for d in dims.split(",") if d))
  return out


def computations(text: str, *, headers: bool = False) -> dict:
  """{name: (is_entry, [instruction lines])} of an HLO module's text, in the order it
  defines them (callees first); `headers`: (is_entry, lines, header line without "ENTRY ",
  closing line: "}", or e.g. `}, execution_thread="sparsecore"` for v5p's SparseCore)."""
  comps, name = {}, None
  for line in text.splitlines():
    header = _HEADER.match(line)
    if header:
      name = header.group(2)
      comps[name] = (bool(header.group(1)), [], line.removeprefix("ENTRY "), "}")
    elif line.rstrip() == "}" or line.startswith("}, execution_thread="):
      # (an attribute may span lines: "}}, metadata=...")
      if name is not None and line.rstrip() != "}":
        comps[name] = comps[name][:3] + (line.rstrip(),)
      name = None
    elif name is not None:
      comps[name][1].append(line)
  return comps if headers else {k: v[:2] for k, v in comps.items()}


def opcode(line: str) -> str:
  """The opcode of an HLO instruction line ("" for anything else)."""
  instr = _INSTR.match(line)
  return instr.group(3) if instr else ""


def callees(lines) -> list[str]:
  """Names of the computations the instruction `lines` refer to (fused computations, loop
  bodies and conditions, branches, called computations, reducers)."""
  out = []
  for line in lines:
    for targets in _REFERS.findall(line):
      out += [t for t in re.split(r"[,\s]+", targets.strip("{}").replace("%", "").strip()) if t]
  return out


def trip_count(line: str, comps: dict) -> int:
  """A while loop's iterations: the compiler's `known_trip_count`, else N when its condition
  is `counter < constant(N)` (a `lax.scan` or `fori_loop`, counting from 0), else 1."""
  known = _TRIP.search(line)
  if known:
    return int(known.group(1))
  cond = re.search(r"condition=%?([\w.\-]+)", line)
  lines = comps.get(cond.group(1), (False, []))[1] if cond else []
  constants = {m.group(1): int(m.group(2)) for m in
               (re.match(r"\s*%?([\w.\-]+) = s32\[\]\S* constant\((\d+)\)", x) for x in lines) if m}
  for x in lines:
    root = re.match(r"\s*ROOT .* compare\(%?[\w.\-]+, %?([\w.\-]+)\), direction=LT", x)
    if root and root.group(1) in constants:
      return constants[root.group(1)]
  return 1


def multipliers(comps: dict) -> tuple[dict, set]:
  """(executions of each computation per program call, names of fused computations)."""
  edges, fused = {}, set()
  for name, (_, lines) in comps.items():
    for line in lines:
      instr = _INSTR.match(line)
      opcode = instr.group(3) if instr else ""
      trip = trip_count(line, comps) if opcode == "while" else 1
      for kind, targets in _CALLED.findall(line):
        for target in re.split(r"[,\s]+", targets.strip("{}").replace("%", "").strip()):
          if not target:
            continue
          times = trip if kind in ("body", "condition") else 1
          edges.setdefault(name, []).append((target, times))
          if opcode == "fusion" and kind == "calls":
            fused.add(target)
  mult = {name: 1.0 if entry else 0.0 for name, (entry, _) in comps.items()}
  for name in reversed(list(comps)):   # HLO text defines a computation before its callers
    for target, times in edges.get(name, ()):
      if target in mult:
        mult[target] += mult[name] * times
  return mult, fused


def _kind(opcode: str, computation: str) -> str | None:
  base = opcode.removesuffix("-start")
  if base not in COLLECTIVES:
    return None
  if base == "all-reduce" and computation.startswith("all-reduce-scatter"):
    return "reduce-scatter"   # the TPU compiler's reduce-scatter: an all-reduce fusion
  return base


def executed(text: str):
  """(instruction match, line, executions per program call) of every instruction of the
  optimized HLO `text` in a computation that runs, loops counted by their trip counts."""
  comps = computations(text)
  mult, _ = multipliers(comps)
  for name, (_, lines) in comps.items():
    if mult.get(name):
      for line in lines:
        instr = _INSTR.match(line)
        if instr:
          yield instr, line, name, mult[name]


def collectives(text: str) -> dict:
  """{kind: {"count", "bytes"}} over one call of the program: each collective's count and
  the bytes of the whole array it gathers, reduces or exchanges (per device)."""
  out = {}
  for instr, _, name, times in executed(text):
    kind = _kind(instr.group(3), name)
    if kind is None:
      continue
    sizes = shape_bytes(instr.group(2))
    size = max(sizes, default=0) if instr.group(3).endswith("-start") else sum(sizes)
    entry = out.setdefault(kind, {"count": 0, "bytes": 0.0})
    entry["count"] += int(times)
    entry["bytes"] += size * times
  return out


def pallas_kernels(text: str) -> dict:
  """{kernel: calls per program call} of the Pallas kernels (`tpu_custom_call`s) in the
  optimized HLO `text`, each named by its instruction (e.g. splash attention's
  "splash_mha_fwd_segmented_residuals"), loops counted by their trip counts."""
  out = {}
  for instr, line, _, times in executed(text):
    if 'custom_call_target="tpu_custom_call"' in line:
      kernel = re.sub(r"(\.\d+|\.clone)+$", "", instr.group(1))
      out[kernel] = out.get(kernel, 0) + int(times)
  return out


def largest_buffers(text: str, k: int = 5) -> list[dict]:
  """The `k` largest arrays a program materialises (results of unfused instructions, one
  device's shard), with the JAX operation that made them."""
  comps = computations(text)
  _, fused = multipliers(comps)
  seen = {}
  for name, (_, lines) in comps.items():
    if name in fused:
      continue
    for line in lines:
      instr = _INSTR.match(line)
      if not instr or instr.group(3) in _NOT_BUFFERS or instr.group(2).startswith("("):
        continue
      size = sum(shape_bytes(instr.group(2)))
      op = _OP_NAME.search(line)
      shape = _SHAPE.search(instr.group(2))
      key = (op.group(1) if op else instr.group(1), shape.group(0) if shape else "")
      seen[key] = max(seen.get(key, 0), size)
  top = sorted(seen.items(), key=lambda kv: -kv[1])[:k]
  return [{"bytes": size, "shape": shape, "op": op} for (op, shape), size in top]


_UNITS = {"": 1, "B": 1, "K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30, "T": 2 ** 40}


def _amount(number: str, unit: str) -> float:
  return float(number) * _UNITS.get(unit.upper()[:1] if unit else "", 1)


def out_of_memory(message: str) -> dict | None:
  """The TPU compiler's report of a program that does not fit its HBM: {"required",
  "available"} bytes and, when it lists them, the largest allocations; None otherwise."""
  short = re.search(r"required for HLO temporaries \(([\d.]+)([KMGT]?)\) exceeds available "
                    r"HBM \(([\d.]+)([KMGT]?)\)", message)
  long = re.search(r"Used ([\d.]+)([KMGT]?) of ([\d.]+)([KMGT]?) hbm", message)
  found = short or long
  if found is None:
    return None
  out = {"required": _amount(found.group(1), found.group(2)),
         "available": _amount(found.group(3), found.group(4)), "allocations": []}
  for size, unit, body in re.findall(r"Size: ([\d.]+)([KMGT]?)\n(.*?)(?:=====|\Z)", message,
                                     re.S):
    op, shape = _OP_NAME.search(body), re.search(r"Shape: (\S+)", body)
    out["allocations"].append({"bytes": _amount(size, unit),
                               "shape": shape.group(1) if shape else "",
                               "op": op.group(1) if op else ""})
  return out


_MLIR_DTYPES = {"i1": "pred", "bf16": "bf16", "f16": "f16", "f32": "f32", "f64": "f64",
                "i8": "s8", "i16": "s16", "i32": "s32", "i64": "s64", "ui8": "u8",
                "ui32": "u32", "ui64": "u64"}
_MLIR_OP = re.compile(r"= stablehlo\.(\w+) .*tensor<([\dx]+)x(\w+)> loc\((#loc\d+)\)\s*$")
_MLIR_LOC = re.compile(r'^(#loc\d+) = loc\("([^"]+)"')


def largest_lowered(text: str, k: int = 5) -> list[dict]:
  """The `k` largest results of a lowered (not yet partitioned) program's ops, from its
  StableHLO text with debug info: whole-mesh shapes (before sharding), for a program the
  compiler gave up on before listing its own allocations."""
  names = {m.group(1): m.group(2) for m in map(_MLIR_LOC.match, text.splitlines()) if m}
  seen = {}
  for line in text.splitlines():
    m = _MLIR_OP.search(line)
    if not m:
      continue
    dims, dtype = [int(d) for d in m.group(2).split("x")], _MLIR_DTYPES.get(m.group(3), m.group(3))
    shape = f"{dtype}[{','.join(map(str, dims))}]"
    op = names.get(m.group(4), m.group(1))
    size = shape_bytes(shape)[0] if shape_bytes(shape) else 0
    seen[(op, shape)] = max(seen.get((op, shape), 0), size)
  top = sorted(seen.items(), key=lambda kv: -kv[1])[:k]
  return [{"bytes": size, "shape": shape, "op": op, "whole_mesh": True}
          for (op, shape), size in top]
