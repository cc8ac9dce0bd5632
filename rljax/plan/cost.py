"""A compiled program's FLOPs and bytes per call with every while loop counted by its trip
count.

XLA's cost analysis (`Compiled.cost_analysis()`, the same on CPU and TPU) costs a while
loop's body once, whatever its trip count. A decoder whose layers are one `lax.scan`
(`model.scan_layers`), an update step whose micro-batches are a `lax.scan`, or a chunked
attention looping over query blocks would report about one iteration's cost.

Here each loop's body (and condition) is costed on its own by XLA's HLO cost analysis
(`HloCostAnalysis`, run on the same optimized, per-device HLO: the body as the entry of a
module of the computations it reaches), and the program's figure gains `trip - 1` more
bodies and `trip` more conditions per call of the loop, nested loops recursively:

    counted(c) = costed(c) + Σ_{loops in c} [trip · counted(body) − costed(body)
                                               + trip · costed(condition)]

FLOPs are exact: the generic analysis gives the TPU compiler's own FLOP count on the TPU's
HLO. Bytes of the added iterations follow the generic analysis's model (operands and
results of each unfused instruction), which is within tens of percent of the TPU
compiler's (it leaves out arrays the TPU keeps in on-chip memory). A loop whose trip count
the HLO does not state (`rljax.plan.hlo.trip_count`) is counted once.

Neither analysis counts the FLOPs of a Pallas kernel (a `tpu_custom_call`): those of splash
attention are counted here from its operands' shapes and block sizes (`kernel_flops`).
"""

from __future__ import annotations

import functools
import math
import re

import jax

from rljax.plan import hlo

_BODY = re.compile(r"\bbody=%?([\w.\-]+)")
_CONDITION = re.compile(r"\bcondition=%?([\w.\-]+)")
_BRANCHES = re.compile(r"\bbranch_computations=\{([^}]*)\}")
_FRAME = re.compile(r"\s?\bstack_frame_id=\d+")
# splash attention's kernels (`jax.experimental.pallas.ops.tpu.splash_attention`): matmuls
# per computed (query block, key block) pair and the metadata naming their block sizes
SPLASH = {"splash_mha_fwd": (2, "block_q", "block_kv"),
          "splash_mha_dq": (3, "block_q_dq", "block_kv_dq"),
          "splash_mha_dkv": (4, "block_q_dkv", "block_kv_dkv")}
_CONSTRAINTS = re.compile(r"operand_layout_constraints=\{(.*?)\}\}?, \w+=")
_FLOATS = re.compile(r"\b(?:f32|bf16|f16)\[([\d,]+)\]")


def _module(header: str, comps: dict, order: list, entry: str) -> str:
  """The HLO text of a module whose entry is `entry`, with the computations it reaches."""
  reach, todo = set(), [entry]
  while todo:
    name = todo.pop()
    if name in reach or name not in comps:
      continue
    reach.add(name)
    todo += hlo.callees(comps[name][1])
  out = [header]
  for name in order:   # callees before callers, as the compiler printed them
    if name in reach:
      out += [("ENTRY " if name == entry else "") + comps[name][2], *comps[name][1],
              comps[name][3]]
  # the module's stack-frame table is not part of the text: drop references to it
  return _FRAME.sub("", "\n".join(out))


def _analysis():
  """`(module_text) -> {"flops", "bytes accessed", ...}`: XLA's HloCostAnalysis on the host
  (CPU) client, or None when this jaxlib does not expose it."""
  try:   # JAX has no public entry point for an HloModule's cost
    from jax._src.lib import _jax
    from jaxlib import _hlo
  except ImportError:
    return None
  if not hasattr(_jax, "hlo_module_cost_analysis") or not hasattr(_hlo, "hlo_module_from_text"):
    return None
  client = jax.devices("cpu")[0].client
  return lambda text: _jax.hlo_module_cost_analysis(client, _hlo.hlo_module_from_text(text))


def loop_counted(cost: dict, text: str) -> dict:
  """{"flops", "bytes_accessed", "loops"}: `cost` (one call's `cost_analysis()`, loops counted
  once) with every while loop of the optimized HLO `text` counted by its trip count.

  Args:
    cost: {"flops", "bytes accessed"} of the whole program, per device.
    text: the program's optimized HLO (`Compiled.as_text()`).
  Returns:
    "loops": [{"body", "trip", "flops", "bytes_accessed"}] per loop, its body's cost per
    iteration as counted here (nested loops included); empty when the program has none or
    when this jaxlib cannot cost a computation (then the totals are `cost`'s own).
  """
  flops, nbytes = float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0))
  comps = hlo.computations(text, headers=True)
  whiles = [(name, line) for name, (_, lines, _, _) in comps.items() for line in lines
            if hlo.opcode(line) == "while"]
  analyse = _analysis() if whiles else None
  if analyse is None:
    return {"flops": flops, "bytes_accessed": nbytes, "loops": []}
  header, order = text.splitlines()[0].split(",")[0], list(comps)
  hlo_comps = {k: (entry, lines) for k, (entry, lines, _, _) in comps.items()}

  @functools.cache
  def costed(name: str) -> tuple[float, float]:
    c = analyse(_module(header, comps, order, name))
    return float(c.get("flops", 0.0)), float(c.get("bytes accessed", 0.0))

  loops = []

  @functools.cache
  def extra(name: str) -> tuple[float, float]:
    """What counting `name`'s loops by trip count adds to its once-counted cost."""
    add = [0.0, 0.0]
    for line in comps[name][1]:
      if hlo.opcode(line) == "while":
        body, cond = _BODY.search(line).group(1), _CONDITION.search(line).group(1)
        trip = hlo.trip_count(line, hlo_comps)
        once, nested, test = costed(body), extra(body), costed(cond)
        per_iteration = [once[i] + nested[i] for i in range(2)]
        loops.append({"body": body, "trip": trip, "flops": per_iteration[0],
                      "bytes_accessed": per_iteration[1]})
        for i in range(2):
          add[i] += trip * per_iteration[i] - once[i] + trip * test[i]
        continue
      branches = _BRANCHES.search(line)
      callees = (re.split(r"[,\s]+", branches.group(1).replace("%", "").strip())
                 if branches else hlo.callees([line]))
      nested = [extra(c) for c in callees if c in comps]
      if nested:   # a conditional runs one branch: HloCostAnalysis takes the largest
        pick = max if branches else sum
        for i in range(2):
          add[i] += pick(x[i] for x in nested)
    return add[0], add[1]

  entry = next(k for k, (is_entry, _, _, _) in comps.items() if is_entry)
  more = extra(entry)
  return {"flops": flops + more[0], "bytes_accessed": nbytes + more[1], "loops": loops}


def causal_blocks(q_len: int, kv_len: int, block_q: int, block_kv: int) -> int:
  """(query block, key block) pairs a causal block-sparse kernel computes: those holding a
  key at or before one of their queries (the others are skipped whole)."""
  bq, bk = min(block_q, q_len), min(block_kv, kv_len)
  blocks_kv = -(-kv_len // bk)
  return sum(min(blocks_kv, ((i + 1) * bq - 1) // bk + 1) for i in range(-(-q_len // bq)))


def _splash_flops(lines: list, i: int) -> float:
  """FLOPs of one call of the splash kernel on line `i` (0 for another custom call)."""
  line = lines[i]
  kernel = next((k for k in SPLASH if hlo.opcode(line) == "custom-call"
                 and re.match(rf"\s*(?:ROOT )?%?{k}", line)), None)
  constraints = _CONSTRAINTS.search(line)
  if kernel is None or constraints is None:
    return 0.0
  shapes = [[int(d) for d in m.split(",")] for m in _FLOATS.findall(constraints.group(1))]
  q, k = [x for x in shapes if len(x) >= 3][:2]
  matmuls, q_key, kv_key = SPLASH[kernel]
  meta = " ".join(lines[i + 1:i + 4])   # the kernel's metadata follows on its own lines
  sizes = {key: int(v) for key, v in re.findall(r'\\"(\w+)\\": (\d+)', meta)}
  if kernel == "splash_mha_dkv" and '\\"use_fused_bwd_kernel\\": true' in meta:
    matmuls += 1   # dq computed in the same kernel
  rows_heads = math.prod(q[:-2])   # [..., H, S, Dh]
  blocks = causal_blocks(q[-2], k[-2], sizes.get(q_key, q[-2]), sizes.get(kv_key, k[-2]))
  bq, bk = min(sizes.get(q_key, q[-2]), q[-2]), min(sizes.get(kv_key, k[-2]), k[-2])
  return 2.0 * matmuls * rows_heads * blocks * bq * bk * q[-1]


def kernel_flops(text: str) -> float:
  """FLOPs of the splash attention kernels of one call of the optimized HLO `text`, every
  loop counted by its trip count; XLA's cost analysis counts a Pallas kernel as none.

  Per call: 2 · matmuls · rows · heads · (computed block pairs) · block_q · block_kv · Dh,
  with 2 matmuls in the forward kernel (Q·Kᵀ, P·V), 3 in dq (Q·Kᵀ again, dO·Vᵀ, dS·K) and 4 in
  dkv (Q·Kᵀ, Pᵀ·dO, dO·Vᵀ, dSᵀ·Q): what the kernels execute, recomputation included, on
  the causal blocks they do not skip (`causal_blocks`; rljax's splash mask is causal).
  """
  comps = hlo.computations(text)
  mult, _ = hlo.multipliers(comps)
  total = 0.0
  for name, (_, lines) in comps.items():
    if mult.get(name):
      total += mult[name] * sum(_splash_flops(lines, i) for i, line in enumerate(lines)
                                if "tpu_custom_call" in line)
  return total
