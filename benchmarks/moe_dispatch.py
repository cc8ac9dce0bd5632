"""MoE block forward + backward: one device vs experts split over an "expert" mesh axis, by
jit's sharding propagation or by shard_map with all-gather or all-to-all dispatch.

Runs on simulated CPU devices (`--devices`, default 8, mesh data × expert) unless real
devices exist. Reports the compile time, the median step time of a jitted value-and-grad
of the `MoEMLP` block, and the collectives in each compiled program. CPU "devices" share
the host's cores, so step times compare the programs' overheads, not a real interconnect.

    python benchmarks/moe_dispatch.py [--experts 8] [--expert-axis 4] [--tokens 2048]
        [--width 256] [--ffn 512] [--top-k 2] [--reps 5] [--reduced]

Last line: RESULT {"metric": "moe_dispatch_step_s", "rljax": the all-to-all step (s),
"peer": the unsharded step (s), "ratio": peer / rljax, "steps_s": {style: s}, ...}.
`--reduced` (CI): 64 tokens, width 16, 4 experts over 4 devices, one timed call.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import statistics
import time


def _args():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--devices", type=int, default=8)
  p.add_argument("--expert-axis", type=int, default=4)
  p.add_argument("--experts", type=int, default=8)
  p.add_argument("--top-k", type=int, default=2)
  p.add_argument("--tokens", type=int, default=2048)
  p.add_argument("--width", type=int, default=256)
  p.add_argument("--ffn", type=int, default=512)
  p.add_argument("--reps", type=int, default=5)
  p.add_argument("--reduced", action="store_true",
                 help="a seconds-long run of the same code (CI): 64 tokens, width 16, ffn 32")
  args = p.parse_args()
  if args.reduced:
    args.tokens, args.width, args.ffn, args.experts, args.reps = 64, 16, 32, 4, 1
  return args


def _collectives(compiled) -> dict[str, int]:
  text = compiled.as_text()
  ops = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")
  return {op: len(re.findall(rf"\s{op}(-start)?\(", text)) for op in ops}


def _measure(step, state, x, reps):
  t0 = time.perf_counter()
  compiled = step.lower(state, x).compile()
  compile_s = time.perf_counter() - t0
  jax_block = lambda out: [a.block_until_ready() for a in __import__("jax").tree.leaves(out)]
  jax_block(compiled(state, x))
  times = []
  for _ in range(reps):
    t0 = time.perf_counter()
    jax_block(compiled(state, x))
    times.append(time.perf_counter() - t0)
  return compile_s, statistics.median(times), _collectives(compiled)


def main():
  args = _args()
  flag = "--xla_force_host_platform_device_count"
  if flag not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flag}={args.devices}".strip()
  import jax
  import jax.numpy as jnp
  from flax import nnx
  from jax.sharding import NamedSharding, PartitionSpec

  from rljax.models import ModelConfig
  from rljax.models.moe import MoEMLP, grouped_swiglu
  from rljax.parallel import make_mesh, shard_model
  from rljax.parallel.expert import expert_parallel

  cfg = ModelConfig(vocab_size=8, hidden_size=args.width, intermediate_size=args.ffn,
                    num_layers=1, num_heads=1, num_experts=args.experts,
                    num_experts_per_tok=args.top_k, moe_intermediate_size=args.ffn,
                    norm_topk_prob=True)
  mesh = make_mesh(data=-1, expert=args.expert_axis, devices=jax.devices()[:args.devices])
  x = jax.random.normal(jax.random.key(0), (args.devices, args.tokens // args.devices,
                                            args.width))
  results, collectives = {}, {}
  for name in ("unsharded", "jit", "all_gather", "all_to_all"):
    block = MoEMLP(cfg, rngs=nnx.Rngs(0))
    xs = x
    experts = grouped_swiglu
    if name != "unsharded":
      block = shard_model(block, mesh)
      xs = jax.device_put(x, NamedSharding(mesh, PartitionSpec(("data", "expert"))))
    if name in ("all_gather", "all_to_all"):
      experts = functools.partial(expert_parallel, grouped_swiglu, mesh=mesh, dispatch=name)
    graphdef, state = nnx.split(block)

    def loss(state, x, experts=experts, graphdef=graphdef):
      y, _ = nnx.merge(graphdef, state)(x, experts=experts)
      return jnp.sum(jnp.square(y))

    step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
    compile_s, step_s, coll = _measure(step, state, xs, args.reps)
    results[name], collectives[name] = step_s, coll
    print(f"{name:>10}: compile {compile_s:6.2f} s  step {step_s * 1e3:8.1f} ms  {coll}")
  config = {"devices": args.devices, "expert_axis": args.expert_axis, "experts": args.experts,
            "top_k": args.top_k, "tokens": args.tokens, "width": args.width, "ffn": args.ffn,
            "reps": args.reps, "reduced": args.reduced}
  print("RESULT " + json.dumps({
      "metric": "moe_dispatch_step_s", "rljax": results["all_to_all"],
      "peer": results["unsharded"], "ratio": results["unsharded"] / results["all_to_all"],
      "steps_s": results, "collectives": collectives, **config}))


if __name__ == "__main__":
  main()
