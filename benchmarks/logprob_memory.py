"""Peak memory of per-token log-probs + entropies: naive full log-softmax vs rljax chunked.

Both compute, for completion hidden states h [B,T,D] and an lm head W [D,V] at Qwen vocab
size V = 151,936, the temperature-scaled log-prob of the target tokens and the entropy,
and the gradient of a masked sum of log-probs w.r.t. h and W (what the trainer needs).
Peak bytes come from XLA's compiled `memory_analysis()` (arguments + outputs +
temporaries; nothing is executed, so large shapes are fine on a laptop).

  python benchmarks/logprob_memory.py [--batch 4 --seq 1024 --width 896 --chunk 64]
  python benchmarks/logprob_memory.py --reduced   # seconds: CI's run

`--reduced`: batch 2, 64 positions, width 32, vocab 1,024, chunks of 16, float32.

The last line is `RESULT {"metric": "peak_bytes", "rljax": ..., "peer": ..., "ratio": ...}`
where "peer" is the naive computation (the `jax.nn.log_softmax` on full logits that
most JAX/PyTorch trainers run).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from rljax.models.logprobs import logprobs_and_entropy_from_hidden  # noqa: E402

VOCAB = 151_936
REDUCED_ARGS = dict(batch=2, seq=64, width=32, chunk=16, dtype="float32", vocab=1024)


def naive(h, w, y, mask, temperature):
  logits = jnp.einsum("btd,dv->btv", h, w, preferred_element_type=jnp.float32) / temperature
  logsm = jax.nn.log_softmax(logits, axis=-1)  # [B,T,V] float32
  logp = jnp.take_along_axis(logsm, y[..., None], axis=-1)[..., 0]
  entropy = -jnp.sum(jnp.exp(logsm) * logsm, axis=-1)
  return logp, entropy


def chunked(h, w, y, mask, temperature, chunk):
  head = lambda x: jnp.einsum("bcd,dv->bcv", x, w, preferred_element_type=jnp.float32)
  return logprobs_and_entropy_from_hidden(h, y, head, temperature=temperature,
                                          chunk_size=chunk)


def peak_bytes(fn, *args) -> int:
  mem = jax.jit(fn).lower(*args).compile().memory_analysis()
  return int(mem.argument_size_in_bytes + mem.output_size_in_bytes + mem.temp_size_in_bytes
             - mem.alias_size_in_bytes)


def with_grad(fn):
  def loss(h, w, y, mask, temperature):
    logp, entropy = fn(h, w, y, mask, temperature)
    return jnp.sum(logp * mask), entropy
  return jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--batch", type=int, default=4)
  ap.add_argument("--seq", type=int, default=1024)
  ap.add_argument("--width", type=int, default=896)  # Qwen2.5-0.5B
  ap.add_argument("--vocab", type=int, default=VOCAB)
  ap.add_argument("--chunk", type=int, default=64)
  ap.add_argument("--dtype", default="bfloat16", help="dtype of h and W")
  ap.add_argument("--reduced", action="store_true", help="seconds: `REDUCED_ARGS` (CI's run)")
  a = ap.parse_args()
  if a.reduced:
    vars(a).update(REDUCED_ARGS)
  dt = jnp.dtype(a.dtype)
  args = (jax.ShapeDtypeStruct((a.batch, a.seq, a.width), dt),
          jax.ShapeDtypeStruct((a.width, a.vocab), dt),
          jax.ShapeDtypeStruct((a.batch, a.seq), jnp.int32),
          jax.ShapeDtypeStruct((a.batch, a.seq), jnp.float32),
          jax.ShapeDtypeStruct((), jnp.float32))
  ch = lambda h, w, y, m, t: chunked(h, w, y, m, t, a.chunk)
  rows = {
      "forward": (peak_bytes(naive, *args), peak_bytes(ch, *args)),
      "forward+backward": (peak_bytes(with_grad(naive), *args),
                           peak_bytes(with_grad(ch), *args)),
  }
  print(f"B={a.batch} T={a.seq} D={a.width} V={a.vocab} chunk={a.chunk} dtype={a.dtype}")
  print(f"{'':18s} {'naive MB':>10s} {'chunked MB':>11s} {'ratio':>6s}")
  for name, (n, c) in rows.items():
    print(f"{name:18s} {n / 2**20:10.1f} {c / 2**20:11.1f} {n / c:6.2f}")
  n, c = rows["forward+backward"]
  print("RESULT " + json.dumps({"metric": "peak_bytes", "rljax": c, "peer": n,
                                "ratio": round(n / c, 4), "forward": rows["forward"],
                                "batch": a.batch, "seq": a.seq, "width": a.width,
                                "vocab": a.vocab, "chunk": a.chunk, "dtype": a.dtype,
                                "reduced": a.reduced}))


if __name__ == "__main__":
  main()
