"""Compiling one program and reading what the compiler says about it: per-device memory
(`memory_analysis`), FLOPs and bytes (`cost_analysis`, every loop counted by its trip
count, plus the FLOPs of splash attention's Pallas kernels: `rljax.plan.cost`),
collectives, Pallas kernels and largest arrays (the optimized HLO), and the roofline time
on the plan's chip.

A program the TPU compiler cannot fit in a chip's HBM fails to compile; its report then
carries the compiler's own figures (memory required, the largest allocations when it lists
them) and the model FLOPs of the program (its roofline counts compute only).
"""

from __future__ import annotations

import time
import warnings

import jax

from rljax.plan import hlo
from rljax.plan.abstract import per_chip_bytes
from rljax.plan.cost import kernel_flops, loop_counted
from rljax.plan.programs import Program


def _cost(analysis) -> dict:
  """`cost_analysis()` as one dict (older JAX versions return a list of one)."""
  if isinstance(analysis, list | tuple):
    analysis = analysis[0] if analysis else {}
  return dict(analysis or {})


def roofline(flops: float, bytes_accessed: float, chip) -> tuple[float | None, str]:
  """(seconds, "compute" | "memory"): max(FLOPs / peak, bytes / bandwidth), the time a
  program cannot beat on `chip` (None without chip figures)."""
  if chip is None:
    return None, ""
  compute, memory = flops / chip.peak_flops, bytes_accessed / chip.hbm_bandwidth
  return max(compute, memory), "compute" if compute >= memory else "memory"


def _memory(compiled, resident: float) -> dict:
  m = compiled.memory_analysis()
  out = {"arguments": float(m.argument_size_in_bytes), "outputs": float(m.output_size_in_bytes),
         "temporaries": float(m.temp_size_in_bytes), "aliases": float(m.alias_size_in_bytes),
         "generated_code": float(m.generated_code_size_in_bytes), "resident": float(resident)}
  out["total"] = (out["arguments"] + out["outputs"] - out["aliases"] + out["temporaries"]
                  + out["generated_code"] + resident)
  return out


def _failed(program: Program, lowered, args, err) -> dict:
  """The report of a program the compiler refused (out of memory) or failed to compile
(any other error: its message, and the arguments' bytes as its memory)."""
  oom = hlo.out_of_memory(str(err)) or {"required": 0.0, "available": None, "allocations": []}
  arguments = per_chip_bytes(args)
  required = max(oom["required"], arguments)
  lines = [x for x in str(err).splitlines() if x.strip()]
  return {"compiled": False, "error": " ".join(lines[:2])[:600],
          "flops": program.model_flops, "flops_source": "model (PaLM's count)",
          "bytes_accessed": 0.0,
          "per_chip_bytes": {"arguments": arguments, "outputs": 0.0,
                             "temporaries": max(required - arguments, 0.0), "aliases": 0.0,
                             "generated_code": 0.0, "resident": program.resident,
                             "total": required + program.resident},
          "compiler_available": oom["available"],
          "largest_buffers": oom["allocations"] or hlo.largest_lowered(
              lowered.as_text(debug_info=True)),
          "collectives": {}}


def measure(program: Program, chip, hbm_limit: float | None, devices: int) -> dict:
  """Lowers and compiles `program`; returns its report (the `programs` entry of a plan).

  Args:
    chip: the chip's figures (None: no roofline).
    hbm_limit: per-chip bytes a program must fit in (None: unknown, counts as fitting).
    devices: devices of the program's mesh.
  """
  t0 = time.perf_counter()
  lowered, args = program.lower()
  t1 = time.perf_counter()
  try:
    with warnings.catch_warnings():   # a persistent cache cannot load compile-only programs
      warnings.filterwarnings("ignore", message="Error reading persistent compilation cache")
      compiled = lowered.compile()
    report = None
  except jax.errors.JaxRuntimeError as err:
    report = _failed(program, lowered, args, err)
  t2 = time.perf_counter()
  if report is None:
    text = compiled.as_text()
    cost = loop_counted(_cost(compiled.cost_analysis()), text)
    kernels = kernel_flops(text)
    report = {"compiled": True, "flops": cost["flops"] + kernels, "kernel_flops": kernels,
              "bytes_accessed": cost["bytes_accessed"], "loops": cost["loops"],
              "kernels": hlo.pallas_kernels(text),
              "per_chip_bytes": _memory(compiled, program.resident),
              "largest_buffers": hlo.largest_buffers(text),
              "collectives": hlo.collectives(text)}
  seconds, bound = roofline(report["flops"], report["bytes_accessed"], chip)
  total = report["per_chip_bytes"]["total"]
  fits = report["compiled"] and (hbm_limit is None or total <= hbm_limit)
  return {"name": program.name, "fits": bool(fits), "compile_s": round(t2 - t0, 2),
          "lower_s": round(t1 - t0, 2), **report, "hbm_bytes": hbm_limit,
          "roofline_s": seconds, "bound": bound, "calls": program.calls,
          "tokens": program.tokens,
          "hbm_fraction": None if not hbm_limit else round(total / hbm_limit, 4),
          "arithmetic_intensity": (report["flops"] / report["bytes_accessed"]
                                   if report["bytes_accessed"] else None)}
