"""Where rljax's time goes: XLA per-op profile of the decode loop and of the update step.

Runs the static sampler (`rljax.sampling.generate`: prefill + `lax.while_loop` decode) at
the given batch sizes, the GRPO benchmark's rollout (`--what rollout`: the trainer's
continuous sampler, one prefill per prompt) and the trainer's update step (`workload.RljaxGRPO`: forward,
backward and AdamW, lm head on the completion positions, one micro-batch) under
`jax.profiler`, with XLA dumping the optimised HLO of every program. Each executed XLA
operation (a fusion, a dot, a copy, ...) is mapped back, through the HLO's stack-frame
metadata, to the rljax function that emitted it (`RMSNorm.__call__`, `apply_rope`,
`_chunk_stats`, ...), to the pass (forward, or backward when JAX's name for it has
`transpose(`) and to its kind (matmul when the fusion contains a dot, copy/transpose,
or elementwise/reduce). Printed: time per component, the largest single operations, and
the share of all profiled operation time each takes.

Shapes: `--shape toy` (the shared tiny Qwen2: 4 layers, width 256, vocab 512; update batch
64 x (32 + 96)), `--shape qwen25_05b` (24 layers, width 896, vocab 151,936; update batch 8 x
(64 + 128)), or either with any of the size flags overridden. Weights are random (rljax's
own initialisation); values do not change the operations' cost.

    python benchmarks/profile_ops.py --shape toy --what decode8,decode64,update
    python benchmarks/profile_ops.py --shape qwen25_05b --what decode8,update --reps 1
    python benchmarks/profile_ops.py --shape toy --what update --dtype bfloat16
    python benchmarks/profile_ops.py --reduced   # seconds: CI's run (measures nothing)

`--dtype bfloat16` profiles bf16 compute (float32 parameters, float32 accumulation in the
matmuls and log-softmax). Op times are summed over XLA's threads; "wall" is the traced
calls' elapsed time. `--reduced`: `--shape reduced` (`workload.REDUCED_HF_CONFIG`'s
sizes, 8 + 8 tokens), `--what decode2,update --reps 1`. The persistent compilation cache
is off here: a program loaded from it is not dumped, so its ops could not be attributed.
Last line: RESULT {"metric": "profile_shares", ...} with the shares.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re
import statistics
import sys
import time

from workload import REDUCED, REDUCED_HF_CONFIG, scratch_dir

SHAPES = {
    "toy": dict(layers=4, width=256, heads=4, kv_heads=2, head_dim=64, intermediate=768,
                vocab=512, tied=0, rope_theta=1e4, prompt_len=32, new_tokens=96,
                update_rows=64),
    "qwen25_05b": dict(layers=24, width=896, heads=14, kv_heads=2, head_dim=64,
                       intermediate=4864, vocab=151936, tied=1, rope_theta=1e6, prompt_len=64,
                       new_tokens=128, update_rows=8),
}
_R = REDUCED_HF_CONFIG
SHAPES["reduced"] = dict(
    layers=_R["num_hidden_layers"], width=_R["hidden_size"], heads=_R["num_attention_heads"],
    kv_heads=_R["num_key_value_heads"], head_dim=_R["head_dim"],
    intermediate=_R["intermediate_size"], vocab=_R["vocab_size"], tied=0,
    rope_theta=_R["rope_theta"], prompt_len=REDUCED["prompt_len"],
    new_tokens=REDUCED["new_tokens"], update_rows=REDUCED["prompts"] * REDUCED["group"])
# Components of the lever table: (name, test on "caller > function" of the op's innermost
# rljax frames, on the op's kind)
COMPONENTS = (
    ("lm head matmul", lambda f, k: ("_chunk_stats" in f or "logits_from_hidden" in f
                                     or "few_row_logits" in f) and k == "matmul"),
    ("log-softmax / entropy over V", lambda f, k: "_chunk_stats" in f or "_chunked" in f),
    ("sampling over V (filters, draw)", lambda f, k: "filters.py" in f or "sample" in f
     or "_sampler" in f or "draw" in f),
    ("q/k/v/o projections", lambda f, k: ("qkv" in f or "_project_heads" in f
                                          or "_split_fused" in f or "attend > dense" in f
                                          or "project_out" in f)
     and k == "matmul"),
    ("attention matmuls", lambda f, k: ("attend" in f or "_one_query" in f) and k == "matmul"),
    ("attention softmax / mask / layout", lambda f, k: "attend" in f or "_one_query" in f
     or "write_cache" in f or "hidden_states" in f or "hidden_cached" in f),
    ("MLP matmuls", lambda f, k: ("MLP" in f or "swiglu_down" in f) and k == "matmul"),
    ("RoPE", lambda f, k: "rope" in f),
    ("RMSNorm", lambda f, k: "RMSNorm" in f),
    ("SiLU / gating", lambda f, k: "MLP" in f or "swiglu" in f),
    ("embedding gather / scatter", lambda f, k: "embed" in f),
    ("optimizer (AdamW, clipping)", lambda f, k: "optax" in f or "_apply" in f),
    ("other matmuls", lambda f, k: k == "matmul"),
    ("other copies / transposes", lambda f, k: k == "copy/transpose"),
)
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+) = .*?\s([\w\-]+)\((.*)$")
_COMP = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+) .*\{\s*$")


def parse_hlo(path: str) -> dict:
  """Instructions of one optimised-HLO text dump: name -> (opcode, op_name, frames, has_dot).

  `frames` is the Python stack (innermost first) of the instruction, as (file, function)
  pairs from the module's StackFrames table; `has_dot`: the op is or calls a dot.
  """
  text = open(path).read()
  files, funcs, locs, frames = {}, {}, {}, {}
  section = None
  comps: dict[str, list] = {}
  current = None
  for line in text.splitlines():
    if line in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
      section = line
      continue
    if section and re.match(r"^\d+ ", line):
      idx, rest = line.split(" ", 1)
      idx = int(idx)
      if section == "FileNames":
        files[idx] = rest.strip('"')
      elif section == "FunctionNames":
        funcs[idx] = rest.strip('"')
      elif section == "FileLocations":
        f = int(re.search(r"file_name_id=(\d+)", rest).group(1))
        g = int(re.search(r"function_name_id=(\d+)", rest).group(1))
        ln = int(re.search(r"\bline=(\d+)", rest).group(1))
        locs[idx] = (files.get(f, "?"), funcs.get(g, "?"), ln)
      else:
        loc = int(re.search(r"file_location_id=(\d+)", rest).group(1))
        parent = int(re.search(r"parent_frame_id=(\d+)", rest).group(1))
        frames[idx] = (loc, parent)
      continue
    m = _COMP.match(line)
    if m and "=" not in line.split("{")[0]:
      section, current = None, m.group(1)
      comps[current] = []
      continue
    m = _INSTR.match(line)
    if m and current is not None:
      comps[current].append((m.group(1), m.group(2), line))

  def stack(frame_id):
    # The table lists frames from 1; a frame's parent_frame_id is its parent's number + 1
    # (0: none), which is how a frame that is its own "parent" reads as the outermost.
    out, seen = [], set()
    while frame_id in frames and frame_id not in seen:
      seen.add(frame_id)
      loc, parent = frames[frame_id]
      if loc in locs:
        out.append(locs[loc])
      frame_id = parent - 1
    return out

  def has_dot(comp, depth=0):
    for _, opcode, line in comps.get(comp, []):
      if opcode in ("dot", "convolution"):
        return True
      called = re.search(r"calls=%?([\w.\-]+)", line)
      if called and depth < 3 and has_dot(called.group(1), depth + 1):
        return True
    return False

  out = {}
  for instrs in comps.values():
    for name, opcode, line in instrs:
      op_name = re.search(r'op_name="([^"]*)"', line)
      frame = re.search(r"stack_frame_id=(\d+)", line)
      called = re.search(r"calls=%?([\w.\-]+)", line)
      out[name] = (opcode, op_name.group(1) if op_name else "",
                   stack(int(frame.group(1))) if frame else [],
                   opcode in ("dot", "convolution")
                   or bool(called and opcode == "fusion" and has_dot(called.group(1))),
                   bool(called and re.search(r"(copy|transpose)", called.group(1) + name)))
  return out


def where(frames) -> str:
  """`caller > function` of the innermost frames inside rljax (or optax), e.g.
  `MLP.__call__ > dense`; the source file for a function of a few generic names."""
  if frames and "/optax/" in frames[0][0]:
    return "optax"
  names = []
  for f, fn, _ in frames:
    if "/rljax/" in f and (not names or names[-1] != fn):
      names.append(fn)
  if not names:
    return "(no rljax frame)"
  return " > ".join(reversed(names[:2]))


def kind(opcode: str, has_dot: bool, copyish: bool) -> str:
  if has_dot:
    return "matmul"
  if opcode in ("copy", "transpose") or copyish:
    return "copy/transpose"
  return "elementwise/reduce"


def component(func: str, k: str) -> str:
  for name, test in COMPONENTS:
    if test(func, k):
      return name
  return "other elementwise"


def profile(fn, reps: int, trace_dir: str) -> tuple[dict, list[float]]:
  """Runs `fn` `reps` times under jax.profiler; {(module, op): total ns}, wall seconds."""
  import jax
  from jax.profiler import ProfileData

  walls = []
  jax.profiler.start_trace(trace_dir)
  for _ in range(reps):
    t0 = time.perf_counter()
    fn()
    walls.append(time.perf_counter() - t0)
  jax.profiler.stop_trace()
  path = sorted(glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True),
                key=os.path.getmtime)[-1]
  ops: dict = collections.Counter()
  for plane in ProfileData.from_file(path).planes:
    for line in plane.lines:
      for ev in line.events:
        stats = dict(ev.stats)
        if "hlo_op" in stats and "hlo_module" in stats:
          ops[(stats["hlo_module"], stats["hlo_op"])] += ev.duration_ns
  return ops, walls


def attribute(ops: dict, dump_dir: str) -> list[dict]:
  """One row per executed operation: module, op, ns, opcode, function, pass, kind."""
  modules: dict[str, dict] = {}
  rows = []
  for (module, op), ns in ops.items():
    if module not in modules:
      files = sorted(glob.glob(os.path.join(dump_dir, f"module_*.{module}.cpu_after_optimizations.txt")))
      modules[module] = parse_hlo(files[-1]) if files else {}
    info = modules[module].get(op)
    if info is None:
      rows.append(dict(module=module, op=op, ns=ns, opcode="?", func="(not in dump)",
                       pass_="?", kind="?"))
      continue
    opcode, op_name, frames, has_dot, copyish = info
    if opcode in ("while", "conditional", "call"):   # containers: their bodies are counted
      continue
    rows.append(dict(module=module, op=op, ns=ns, opcode=opcode, func=where(frames),
                     pass_="bwd" if "transpose(" in op_name else "fwd",
                     kind=kind(opcode, has_dot, copyish), op_name=op_name[-90:]))
  return rows


def report(title: str, rows: list[dict], walls: list[float], top: int) -> dict:
  total = sum(r["ns"] for r in rows) or 1
  reps = len(walls)
  print(f"\n## {title}: wall {statistics.median(walls):.3f} s per call (median of {reps}), "
        f"op time {total / 1e9 / reps:.3f} s per call summed over threads")
  by_comp = collections.Counter()
  by_func = collections.Counter()
  for r in rows:
    by_comp[component(r["func"], r["kind"])] += r["ns"]
    by_func[(r["func"], r["pass_"], r["kind"])] += r["ns"]
  print("\n| component | ms per call | share |\n|---|---:|---:|")
  for name, ns in by_comp.most_common():
    print(f"| {name} | {ns / 1e6 / reps:.1f} | {ns / total:.1%} |")
  print("\n| function | pass | kind | ms per call | share |\n|---|---|---|---:|---:|")
  for (func, p, k), ns in by_func.most_common(top):
    print(f"| {func} | {p} | {k} | {ns / 1e6 / reps:.1f} | {ns / total:.1%} |")
  print("\nlargest single operations:\n| op | opcode | function | pass | kind | ms per call "
        "| share |\n|---|---|---|---|---|---:|---:|")
  for r in sorted(rows, key=lambda r: -r["ns"])[:top]:
    print(f"| {r['op']} | {r['opcode']} | {r['func']} | {r['pass_']} | {r['kind']} | "
          f"{r['ns'] / 1e6 / reps:.2f} | {r['ns'] / total:.1%} |")
  return {"wall_s": round(statistics.median(walls), 4),
          "op_s": round(total / 1e9 / reps, 4),
          "components": {k: round(v / total, 4) for k, v in by_comp.most_common()}}


def build(shape: dict, dtype: str):
  """A random-weight rljax Decoder at `shape` (Qwen2 layout)."""
  from flax import nnx

  from rljax.models.decoder import Decoder
  from rljax.models.hf import config_from_hf

  hf = {"architectures": ["Qwen2ForCausalLM"], "vocab_size": shape["vocab"],
        "hidden_size": shape["width"], "intermediate_size": shape["intermediate"],
        "num_hidden_layers": shape["layers"], "num_attention_heads": shape["heads"],
        "num_key_value_heads": shape["kv_heads"], "head_dim": shape["head_dim"],
        "rope_theta": shape["rope_theta"], "tie_word_embeddings": bool(shape["tied"]),
        "max_position_embeddings": 32768, "rms_norm_eps": 1e-6}
  cfg = config_from_hf(hf, dtype=dtype)
  return Decoder(cfg, rngs=nnx.Rngs(0)), cfg


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--shape", default="toy", choices=list(SHAPES))
  for name in SHAPES["toy"]:
    parser.add_argument("--" + name.replace("_", "-"), type=float if name == "rope_theta" else int)
  parser.add_argument("--what", default="decode8,decode64,update")
  parser.add_argument("--reps", type=int, default=2, help="profiled calls of each")
  parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
  parser.add_argument("--top", type=int, default=20)
  parser.add_argument("--devices", type=int, default=1,
                      help="XLA CPU devices (JAX_NUM_CPU_DEVICES) the rollout's and the "
                      "update's rows are split over; op times are summed over the devices")
  parser.add_argument("--reduced", action="store_true",
                      help="seconds: --shape reduced --what decode2,update --reps 1 (CI's run)")
  args = parser.parse_args()
  if args.reduced:
    args.shape, args.what, args.reps = "reduced", "decode2,update", 1
  shape = dict(SHAPES[args.shape])
  shape.update({k: getattr(args, k) for k in shape if getattr(args, k) is not None})
  dump_dir = scratch_dir("rljax_hlo_")
  os.environ["XLA_FLAGS"] = " ".join(filter(None, [
      os.environ.get("XLA_FLAGS", ""), f"--xla_dump_to={dump_dir}", "--xla_dump_hlo_as_text"]))
  os.environ["JAX_NUM_CPU_DEVICES"] = str(args.devices)
  os.environ["JAX_ENABLE_COMPILATION_CACHE"] = "false"   # cached programs are not dumped
  import jax
  import jax.numpy as jnp
  import numpy as np

  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  from workload import GROUP, REDUCED_ROOFLINE, RljaxGRPO, matmul_roofline

  from rljax.sampling import SamplingParams, generate

  load_before = os.getloadavg()[0]
  model, cfg = build(shape, args.dtype)
  p, t = shape["prompt_len"], shape["new_tokens"]
  print(f"shape {shape}, compute {args.dtype}; load average {load_before:.2f}", flush=True)
  results = {}
  for what in args.what.split(","):
    if what.startswith("decode"):
      b = int(what[len("decode"):])
      tokens = np.random.default_rng(0).integers(2, cfg.vocab_size, (b, p))
      sampling = SamplingParams(max_new_tokens=t)

      def fn(tokens=tokens, sampling=sampling):
        generate(model, tokens, np.ones_like(tokens), sampling=sampling,
                 rng=jax.random.key(0)).tokens.block_until_ready()
      title = f"decode, batch {b}: generate {p} + {t} tokens (prefill included)"
    elif what == "rollout":
      grpo = RljaxGRPO(model, new_tokens=t, devices=args.devices)
      prompts = np.random.default_rng(0).integers(2, cfg.vocab_size,
                                                  (shape["update_rows"] // GROUP, p))

      def fn(grpo=grpo, prompts=prompts):
        grpo.rollout(prompts, 0)
      title = (f"rollout: continuous sampler, {prompts.shape[0]} prompts x {GROUP} samples, "
               f"{p} + {t} tokens, {args.devices} device(s)")
    elif what == "update":
      grpo = RljaxGRPO(model, group=shape["update_rows"], new_tokens=t, devices=args.devices)
      rng = np.random.default_rng(0)
      n = shape["update_rows"]
      rows = {"prompt_tokens": rng.integers(2, cfg.vocab_size, (n, p)),
              "prompt_mask": np.ones((n, p), np.int32),
              "tokens": rng.integers(2, cfg.vocab_size, (n, t)),
              "mask": np.ones((n, t), np.int32)}
      _, mb = grpo.minibatch(rows, 0)
      mb["old_logp"] = mb["ref_logp"] = jnp.zeros((n, t), jnp.float32)

      def fn(grpo=grpo, mb=mb):
        grpo.state, metrics = grpo.update_step(grpo.state, mb, jnp.asarray(True))
        float(metrics["loss"])
      title = f"update step, {n} x ({p} + {t}) tokens"
    else:
      raise SystemExit(f"--what: unknown {what!r} (decode<batch>, rollout or update)")
    t0 = time.perf_counter()
    fn()
    print(f"{what}: first call (compiles) {time.perf_counter() - t0:.1f} s", flush=True)
    fn()
    roof_n = REDUCED_ROOFLINE["n"] if args.reduced else 1024
    roof = matmul_roofline(**REDUCED_ROOFLINE) if args.reduced else matmul_roofline()
    ops, walls = profile(fn, args.reps, scratch_dir("rljax_trace_"))
    results[what] = report(title, attribute(ops, dump_dir), walls, args.top)
    results[what]["roofline_gflops"] = round(roof, 1)
    print(f"({roof_n}³ fp32 matmul before the trace: {roof:.0f} GFLOP/s)")
  res = {"metric": "profile_shares", "rljax": results, "peer": None, "ratio": None,
         "shape": shape, "dtype": args.dtype, "what": args.what.split(","), "reps": args.reps,
         "devices": args.devices, "reduced": args.reduced,
         "loadavg_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)]}
  print("RESULT " + json.dumps(res))


if __name__ == "__main__":
  main()
