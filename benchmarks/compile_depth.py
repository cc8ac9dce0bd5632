"""Compile time of the update step against depth: scanned layers vs one module per layer.

The program: the value and gradient of the mean token log-likelihood through rljax's
chunked `logprobs_from_hidden` (the update step's model part), remat on, bf16 compute with
fp32 parameters, one sequence of `--seq` tokens per device. It is lowered from abstract
shapes (`nnx.eval_shape`: no weight is allocated) and compiled with
`jax.jit(...).lower(ShapeDtypeStructs).compile()`, once with `ModelConfig.scan_layers=True`
(the L blocks as one `jax.lax.scan`) and once with `scan_layers=False` (a Python loop of L
blocks), at Qwen2.5-7B's widths (hidden 3,584, MLP 18,944, 28 heads, 4 KV heads, vocabulary
152,064) with 4, 8 and 28 layers, and Llama-3.1-70B's (hidden 8,192, MLP 28,672, 64 heads,
8 KV heads, vocabulary 128,256) with its 80 layers.

Compiled for the host's CPU by default; `--topology v5p:2x2x1` (also) compiles ahead of time
for that TPU slice when `libtpu` is importable (`jax.experimental.topologies`), the
parameters sharded over its chips (`fsdp`) by rljax's logical-axis rules. The persistent
compilation cache is off, so every compile is a real one.

    python benchmarks/compile_depth.py [--cases qwen2.5-7b:4,...] [--layouts scanned,per_layer]
                                       [--seq 2048] [--reps 1] [--topology v5p:2x2x1]
                                       [--no-cpu] [--reduced]

On a shared host a compile's time varies with the load (the same 28-layer scanned TPU
compile took 34-68 s here): `--reps` repeats each pair, scanned and per-layer alternating.

One line per compile: RESULT {"metric": "compile_s", "shape", "layers", "scan_layers",
"platform", "devices", "seq", "rep", "lower_s", "compile_s", "total_s", "flops",
"temp_bytes", "error", "load"}: `lower_s` tracing and lowering, `compile_s` XLA; `flops`
and `temp_bytes` per device, from the compiled program's cost and memory analyses (null
where not reported); `error` why the compile failed (e.g. a TPU program larger than the
chips' HBM), else null.
Note: XLA's cost analysis counts a loop's body once, so a scanned program's `flops` are
about one layer's, not L layers'.
Each (case, rep) with both layouts then prints RESULT {"metric": "compile_s_per_layer_over_scanned",
"shape", "layers", "platform", "rep", "rljax": the scanned compile's seconds, "peer": the
per-layer one's, "ratio": peer / rljax} (null when either compile failed); the per-compile
lines carry "rljax": their own compile seconds, "peer" and "ratio" null.
`--reduced` runs tiny shapes for the CI smoke test (tests/test_benchmarks_compile_depth.py).
"""

from __future__ import annotations

import argparse
import json
import os
import time

SHAPES = {
    "qwen2.5-7b": dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                       num_heads=28, num_kv_heads=4, head_dim=128, arch="qwen2",
                       attention_bias=True, rope_theta=1e6),
    "llama-3.1-70b": dict(vocab_size=128256, hidden_size=8192, intermediate_size=28672,
                          num_heads=64, num_kv_heads=8, head_dim=128, arch="llama",
                          rope_theta=5e5),
    "reduced": dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_heads=4,
                    num_kv_heads=2, head_dim=16, arch="qwen2", attention_bias=True),
}
CASES = "qwen2.5-7b:4,qwen2.5-7b:8,qwen2.5-7b:28,llama-3.1-70b:80"
REDUCED_CASES = "reduced:2,reduced:4"
LAYOUTS = {"scanned": True, "per_layer": False}
CHUNK = 128   # lm-head positions per log-prob chunk (the trainer's default)


def model_config(shape: str, layers: int, scan_layers: bool):
  from rljax.models import ModelConfig

  return ModelConfig(**SHAPES[shape], num_layers=layers, dtype="bfloat16",
                     param_dtype="float32", remat=True, scan_layers=scan_layers)


def loss_and_grad(graphdef, seq: int):
  """(params, tokens [B,S]) -> (mean token log-likelihood, its gradient)."""
  import jax
  import jax.numpy as jnp
  from flax import nnx

  from rljax.models import logprobs_from_hidden

  def loss(params, tokens_bs):
    model = nnx.merge(graphdef, params)
    hidden = model.hidden_states(tokens_bs)   # [B,S,D]
    logp = logprobs_from_hidden(hidden[:, :-1], tokens_bs[:, 1:], model.logits_from_hidden,
                                chunk_size=min(CHUNK, seq - 1))
    return jnp.mean(logp)
  return jax.value_and_grad(loss)


def abstract_inputs(cfg, seq: int, mesh):
  """(graphdef, parameter ShapeDtypeStructs, token ShapeDtypeStruct): one sequence per
  device, parameters placed by the logical-axis rules on `mesh` (unplaced when None)."""
  import jax
  import jax.numpy as jnp
  from flax import nnx

  from rljax.models import Decoder
  from rljax.parallel import batch_sharding, state_shardings

  graphdef, state = nnx.split(nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0))))
  if mesh is None:
    params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)
    return graphdef, params, jax.ShapeDtypeStruct((1, seq), jnp.int32)
  shardings = state_shardings(state, mesh)
  params = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        state, shardings)
  tokens = jax.ShapeDtypeStruct((mesh.size, seq), jnp.int32, sharding=batch_sharding(mesh, 2))
  return graphdef, params, tokens


def _per_device(analysis, key):
  if isinstance(analysis, list | tuple):
    analysis = analysis[0] if analysis else None
  value = None if analysis is None else analysis.get(key)
  return None if value is None else float(value)


def compile_once(cfg, seq: int, mesh=None) -> dict:
  """Seconds to lower and to compile the program, its FLOPs and temporaries per device;
  `error` names why a compile failed (e.g. a TPU program that does not fit in HBM: XLA
  refuses it), else None."""
  import jax

  graphdef, params, tokens = abstract_inputs(cfg, seq, mesh)
  t0 = time.perf_counter()
  lowered = jax.jit(loss_and_grad(graphdef, seq)).lower(params, tokens)
  t1 = time.perf_counter()
  out = {"lower_s": round(t1 - t0, 2), "flops": None, "temp_bytes": None, "error": None}
  try:
    compiled = lowered.compile()
  except Exception as err:  # noqa: BLE001 - reported, the other compiles go on
    compiled, out["error"] = None, f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
  t2 = time.perf_counter()
  out.update(compile_s=round(t2 - t1, 2), total_s=round(t2 - t0, 2))
  if compiled is not None:
    memory = compiled.memory_analysis()
    out.update(flops=_per_device(compiled.cost_analysis(), "flops"),
               temp_bytes=None if memory is None else int(memory.temp_size_in_bytes))
  return out


def tpu_mesh(topology: str):
  """A (data=1, fsdp=chips, tensor=1) mesh of the abstract devices of a TPU topology, or None
  with the reason when libtpu cannot provide it."""
  # compiling only: no need for libtpu's one-process-per-host lock (another process may hold it)
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  try:
    from jax.experimental import topologies

    devices = topologies.get_topology_desc(topology, platform="tpu").devices
  except Exception as err:  # noqa: BLE001 - no libtpu, or a name it does not know
    return None, f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
  from rljax.parallel import make_mesh

  return make_mesh(data=1, fsdp=len(devices), tensor=1, devices=devices), None


def parse_cases(text: str) -> list[tuple[str, int]]:
  out = []
  for item in text.split(","):
    shape, _, layers = item.partition(":")
    if shape not in SHAPES or not layers.isdigit():
      raise SystemExit(f"--cases: {item!r} is not SHAPE:LAYERS with SHAPE in {sorted(SHAPES)}")
    out.append((shape, int(layers)))
  return out


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--cases", default=None, help=f"SHAPE:LAYERS,... (default {CASES})")
  parser.add_argument("--layouts", default="scanned,per_layer", help="scanned,per_layer")
  parser.add_argument("--seq", type=int, default=None, help="tokens per sequence (2048)")
  parser.add_argument("--reps", type=int, default=1, help="compiles per case and layout")
  parser.add_argument("--topology", default="", help="also AOT-compile for this TPU slice")
  parser.add_argument("--no-cpu", action="store_true", help="only the --topology compiles")
  parser.add_argument("--reduced", action="store_true", help="tiny shapes (CI smoke test)")
  args = parser.parse_args(argv)
  args.cases = parse_cases(args.cases or (REDUCED_CASES if args.reduced else CASES))
  args.seq = args.seq or (16 if args.reduced else 2048)
  layouts = args.layouts.split(",")
  if not layouts or any(x not in LAYOUTS for x in layouts):
    raise SystemExit(f"--layouts: {args.layouts!r}; each of {sorted(LAYOUTS)}")
  args.layouts = layouts
  return args


def targets(args) -> list[tuple[str, object]]:
  """(platform name, mesh or None) to compile for."""
  out = [] if args.no_cpu else [("cpu", None)]
  if args.topology:
    mesh, why = tpu_mesh(args.topology)
    if mesh is None:
      print(f"--topology {args.topology}: skipped, no TPU compiler ({why}); "
            "pip install 'jax[tpu]' at the pinned jax version", flush=True)
    else:
      out.append((f"tpu:{args.topology}", mesh))
  return out


def main(argv=None):
  args = parse_args(argv)
  import jax

  jax.config.update("jax_enable_compilation_cache", False)   # every compile a real one
  for platform, mesh in targets(args):
    compile_once(model_config("reduced", 1, True), 8, mesh)   # untimed: one-time start-up
    for shape, layers in args.cases:
      for rep in range(args.reps):
        seconds = {}
        for layout in args.layouts:   # alternating, so a load change hits both layouts
          cfg = model_config(shape, layers, LAYOUTS[layout])
          row = {"metric": "compile_s", "shape": shape, "layers": layers,
                 "scan_layers": LAYOUTS[layout], "platform": platform,
                 "devices": 1 if mesh is None else mesh.size, "seq": args.seq, "rep": rep,
                 **compile_once(cfg, args.seq, mesh), "load": round(os.getloadavg()[0], 1)}
          seconds[layout] = None if row["error"] else row["compile_s"]
          print("RESULT " + json.dumps({**row, "rljax": row["compile_s"], "peer": None,
                                        "ratio": None}), flush=True)
        if len(seconds) == 2:
          scanned, per_layer = seconds["scanned"], seconds["per_layer"]
          ratio = per_layer / scanned if scanned and per_layer else None
          print("RESULT " + json.dumps({
              "metric": "compile_s_per_layer_over_scanned", "shape": shape, "layers": layers,
              "platform": platform, "rep": rep, "rljax": scanned, "peer": per_layer,
              "ratio": ratio}), flush=True)


if __name__ == "__main__":
  main()
