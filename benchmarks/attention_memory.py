"""Per-device compiled temporaries of the update's value-and-gradient, by attention path.

The program: the value and gradient of the token log-likelihood (rljax's chunked
`logprobs_from_hidden`) through `Decoder.hidden_states`, at Qwen2.5-7B widths (hidden 3,584,
MLP 18,944, 28 heads, 4 KV heads, head dim 128, vocabulary 152,064) with 2 layers, bf16
compute, fp32 parameters, remat on, one sequence per device. It is compiled ahead of time on
abstract shapes (`nnx.eval_shape`, `ShapeDtypeStruct`s): nothing is allocated, so 32k-token
programs compile on a laptop. The figure is XLA's `memory_analysis().temp_size_in_bytes`.

Targets: `cpu` (this host's XLA CPU, one device) and TPU topologies such as `v5p:2x2x1`
(needs libtpu: `pip install "jax[tpu]==<the pinned jax>"`; mesh fsdp = chips, one sequence
per chip, compiled under `jax.set_mesh` so that splash runs per shard; libtpu allows one
process per host unless `ALLOW_MULTIPLE_LIBTPU_LOAD=1`). A path a target cannot compile
(splash off TPU, cudnn off GPU) is skipped.

  python benchmarks/attention_memory.py [--seqs 4096 16384 32768] [--targets cpu v5p:2x2x1]
      [--attention xla chunked splash] [--layers 2]
  python benchmarks/attention_memory.py --reduced      # 1 tiny layer, S = 128 / 256 (CI)
  python benchmarks/attention_memory.py --speed        # `auto`'s CPU threshold (see below)
  python benchmarks/attention_memory.py --kernel       # attention alone, S = 2k / 4k / 8k

Each measurement prints `RESULT {"metric": "attention_temp_bytes", "target", "seq",
"attention", "rljax": this path's temporaries, "peer": xla's at the same target and length,
"ratio": peer / rljax, "arguments": argument bytes, "fits", "compile_s"}`. The TPU compiler
refuses a program whose temporaries exceed the chip's HBM: then "fits" is false and
"rljax" the temporaries its error message names (no arguments).

`--speed` times the value-and-gradient of attention alone (B = 8, 4 heads of 32, 2 KV heads:
the trainer's default tiny model) with materialised scores and chunked, in turn (best of 7
each), on this CPU, and prints
`RESULT {"metric": "attention_seconds", "seq", "rljax": chunked s, "peer": xla s, "ratio"}`;
`rljax.models.attention_kernels.AUTO_XLA_MAX_SCORES` (xla up to S = 256) comes from it.

`--kernel` compiles the value-and-gradient of attention alone at Qwen2.5-7B's heads (bf16,
one sequence, S = 2k / 4k / 8k) and prints `RESULT {"metric": "attention_kernel_temp_bytes",
"seq", "rljax": chunked's temporaries, "peer": xla's, "ratio"}`: chunked's grow linearly.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from rljax.models import Decoder, ModelConfig, logprobs_from_hidden  # noqa: E402
from rljax.models.attention_chunked import chunked_attention  # noqa: E402
from rljax.parallel import make_mesh, state_shardings  # noqa: E402

QWEN25_7B = dict(vocab_size=152_064, hidden_size=3584, intermediate_size=18_944, num_heads=28,
                 num_kv_heads=4, head_dim=128, attention_bias=True, rope_theta=1e6)
REDUCED = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_heads=4,
               num_kv_heads=2, head_dim=16, attention_bias=True)


def model_config(widths, layers, attention) -> ModelConfig:
  return ModelConfig(**widths, num_layers=layers, dtype="bfloat16", param_dtype="float32",
                     remat=True, attention=attention, arch="qwen2")


def loss_and_grad(graphdef):
  """value_and_grad over the parameters of Σ log π(y_t) (targets: the tokens themselves)."""
  def loss(state, tokens_bs):
    model = nnx.merge(graphdef, state)
    hidden = model.hidden_states(tokens_bs)
    return jnp.sum(logprobs_from_hidden(hidden, tokens_bs, model.logits_from_hidden))
  return jax.value_and_grad(loss)


def target_mesh(target: str):
  """None for the host's CPU, else a (data 1, fsdp = chips, tensor 1) mesh of the TPU
  topology `target`'s abstract devices."""
  if target == "cpu":
    return None
  from jax.experimental import topologies
  devices = topologies.get_topology_desc(topology_name=target, platform="tpu").devices
  return make_mesh(1, len(devices), 1, devices=devices)


def compile_memory(cfg: ModelConfig, seq: int, mesh):
  """The compiled program's `memory_analysis()`, at one sequence per device."""
  abstract = nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0)))
  graphdef, state = nnx.split(abstract)
  rows = 1 if mesh is None else mesh.size
  tokens = jax.ShapeDtypeStruct((rows, seq), jnp.int32)
  fn = jax.jit(loss_and_grad(graphdef))
  if mesh is None:
    compiled = fn.lower(state, tokens).compile()
  else:
    shard = lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s)  # noqa: E731
    state = jax.tree.map(shard, state, state_shardings(state, mesh))
    batch = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(("data", "fsdp")))
    with jax.set_mesh(mesh):
      compiled = fn.lower(state, shard(tokens, batch)).compile()
  return compiled.memory_analysis()


def supported(attention: str, target: str) -> bool:
  platform = "cpu" if target == "cpu" else "tpu"
  return {"splash": platform == "tpu", "cudnn": False}.get(attention, True)


def measure(args, widths):
  """RESULT lines for every (target, seq, attention); xla first, the others against it."""
  for target in args.targets:
    mesh = target_mesh(target)
    for seq in args.seqs:
      peer = None
      for attention in ["xla"] + [a for a in args.attention if a != "xla"]:
        if not supported(attention, target):
          continue
        start = time.perf_counter()
        try:
          mem = compile_memory(model_config(widths, args.layers, attention), seq, mesh)
          temp, arguments, fits = int(mem.temp_size_in_bytes), int(mem.argument_size_in_bytes), True
        except jax.errors.JaxRuntimeError as e:   # the TPU compiler refuses what exceeds HBM
          temp, arguments, fits = refused_temp_bytes(str(e)), None, False
        peer = temp if attention == "xla" else peer
        result("attention_temp_bytes", temp, peer, target=target, seq=seq,
               attention=attention, arguments=arguments, fits=fits,
               compile_s=round(time.perf_counter() - start, 1))


def refused_temp_bytes(message: str) -> int:
  """The temporaries a RESOURCE_EXHAUSTED compile error names ("... HLO temporaries
  (180.76G) exceeds available HBM (95.74G)"; XLA's G = 2**30 bytes)."""
  found = re.search(r"temporaries \(([0-9.]+)([KMGT])\)", message)
  if "RESOURCE_EXHAUSTED" not in message or not found:
    raise RuntimeError(message)
  return int(float(found.group(1)) * 2 ** (10 * "KMGT".index(found.group(2)) + 10))


def result(metric, rljax, peer, **extra):
  ratio = None if not rljax or peer is None else round(peer / rljax, 3)
  print("RESULT " + json.dumps(dict(metric=metric, rljax=rljax, peer=peer, ratio=ratio,
                                    **extra)), flush=True)


def xla_attention(q, k, v, valid):
  """The materialised-scores path of `Attention.attend_full` (causal + key padding)."""
  b, s, h, d = q.shape
  kh = k.shape[2]
  qg = q.reshape(b, s, kh, h // kh, d)
  mask = jnp.tril(jnp.ones((s, s), bool))[None] & valid[:, None, :]
  scores = jnp.einsum("bskgd,btkd->bkgst", qg, k, preferred_element_type=jnp.float32)
  probs = jax.nn.softmax(jnp.where(mask[:, None, None], scores, -1e30), axis=-1)
  return jnp.einsum("bkgst,btkd->bskgd", probs.astype(v.dtype), v).reshape(b, s, h, d)


def chunked(q, k, v, valid):
  return chunked_attention(q, k.swapaxes(1, 2), v.swapaxes(1, 2), valid, 0)


def kernel_memory(seqs):
  """Temporaries of value-and-grad of attention alone at Qwen2.5-7B's heads (28 x 128, 4 KV
  heads, bf16, one sequence) on this CPU: chunked's backward stores no per-tile
  probabilities, so they double with S; the materialised scores' quadruple."""
  for seq in seqs:
    q = jax.ShapeDtypeStruct((1, seq, 28, 128), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((1, seq, 4, 128), jnp.bfloat16)
    valid = jax.ShapeDtypeStruct((1, seq), jnp.bool_)
    temp = {}
    for name, fn in (("xla", xla_attention), ("chunked", chunked)):
      loss = lambda q, k, v, m, fn=fn: jnp.sum(fn(q, k, v, m).astype(jnp.float32))  # noqa: E731
      grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))
      temp[name] = int(grad.lower(q, kv, kv, valid).compile().memory_analysis()
                       .temp_size_in_bytes)
    result("attention_kernel_temp_bytes", temp["chunked"], temp["xla"], seq=seq)


def best_seconds(fns, *args, reps=7):
  """{name: best-of-`reps` seconds}, the functions timed in turn so they share the load."""
  for fn in fns.values():
    jax.block_until_ready(fn(*args))
  times = {name: [] for name in fns}
  for _ in range(reps):
    for name, fn in fns.items():
      start = time.perf_counter()
      jax.block_until_ready(fn(*args))
      times[name].append(time.perf_counter() - start)
  return {name: min(t) for name, t in times.items()}


def speed(seqs, batch=8, heads=4, kv_heads=2, dh=32):
  """Best-of-7 seconds of value-and-grad of attention alone, chunked vs xla, per length."""
  for seq in seqs:
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.standard_normal((batch, seq, heads, dh), np.float32))
    k, v = (jnp.asarray(rng.standard_normal((batch, seq, kv_heads, dh), np.float32))
            for _ in range(2))
    valid = jnp.ones((batch, seq), bool)
    grads = {}
    for name, fn in (("xla", xla_attention), ("chunked", chunked)):
      loss = lambda q, k, v, m, fn=fn: jnp.sum(fn(q, k, v, m) ** 2)  # noqa: E731
      grads[name] = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))
    times = best_seconds(grads, q, k, v, valid)
    result("attention_seconds", round(times["chunked"], 4), round(times["xla"], 4), seq=seq,
           load=round(os.getloadavg()[0], 1))


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--seqs", type=int, nargs="+", default=[4096, 16384, 32768])
  ap.add_argument("--targets", nargs="+", default=["cpu"])
  ap.add_argument("--attention", nargs="+", default=["xla", "chunked", "splash"])
  ap.add_argument("--layers", type=int, default=2)
  ap.add_argument("--reduced", action="store_true", help="tiny widths and lengths (CI)")
  ap.add_argument("--speed", action="store_true", help="time xla vs chunked on this CPU")
  ap.add_argument("--kernel", action="store_true",
                  help="temporaries of attention alone at 7B heads, S = 2k / 4k / 8k")
  args = ap.parse_args(argv)
  print(f"jax {jax.__version__}, load average {os.getloadavg()[0]:.1f}", flush=True)
  if args.speed:
    speed([128, 256, 512, 1024, 2048] if args.seqs == ap.get_default("seqs")
          else args.seqs)
    return
  if args.kernel:
    kernel_memory([2048, 4096, 8192] if args.seqs == ap.get_default("seqs") else args.seqs)
    return
  if args.reduced:
    args.seqs = [128, 256] if args.seqs == ap.get_default("seqs") else args.seqs
    args.layers = 1
  measure(args, REDUCED if args.reduced else QWEN25_7B)


if __name__ == "__main__":
  main()
