"""Packed vs padded update step on a rollout batch with long-tailed lengths.

The trainer's real update step (`rljax.train.update.build_update_step`, GRPO loss, AdamW)
on the shared benchmark model's shape (vocab 512, width 256, MLP 768, 4 layers, 4 heads x 64, 2 KV
heads): 64 sequences of a 32-token prompt bucket (real prompts 16-32 tokens) and up to 256
completion tokens, completion lengths geometric with mean ~0.3 of the budget (mean/max
of the whole sequences <= 0.4). `algo.pack_sequences=True` packs the real tokens into
rows of P + T (`rljax.train.packing`); False computes the padded [64, P + T]. Both sides
alternate call by call in one process (medians over `--reps`); peak memory is XLA's
`memory_analysis()` of each compiled step (arguments + outputs + temporaries - donated).
The packed step's losses equal the padded one's (checked here on the first call, and in
tests/test_train_packing.py for every aggregation mode).

    python benchmarks/packing.py [--reps 5]
    python benchmarks/packing.py --reduced   # seconds: CI's run (measures nothing)

`--reduced`: `REDUCED_SHAPE` (8 rows of 8 + up to 32 tokens; vocab 128, width 32, 2 layers),
--reps 1.

Last line: RESULT {"metric": "update_tokens_per_s", "rljax": <packed>, "peer": <padded>,
"ratio": ..., "peak_mb_packed": ..., "peak_mb_padded": ...}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from workload import scratch_dir

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
SHAPE = dict(rows=64, prompt=32, completion=256, vocab=512, width=256, mlp=768, layers=4,
             heads=4, kv_heads=2, head_dim=64, prompts=8, n=8)
# vocab 128: the task tokenizer of experiments/grpo.py has 90 ids
REDUCED_SHAPE = dict(rows=8, prompt=8, completion=32, vocab=128, width=32, mlp=64, layers=2,
                     heads=2, kv_heads=1, head_dim=16, prompts=2, n=4)


def _setup(pack: bool, shape: dict):
  """(the run, a fresh placed state, the compiled iteration pieces) of the packed or padded
  configuration; the trainer internals a benchmark needs, imported here only."""
  from rljax.train.config import load_config
  from rljax.train.run.build import build
  from rljax.train.run.iteration import make_trainer
  over = {"model.vocab_size": shape["vocab"], "model.hidden_size": shape["width"],
          "model.intermediate_size": shape["mlp"], "model.num_layers": shape["layers"],
          "model.num_heads": shape["heads"], "model.num_kv_heads": shape["kv_heads"],
          "model.head_dim": shape["head_dim"], "model.max_position_embeddings": 1024,
          "sampling.max_new_tokens": shape["completion"],
          "sampling.prompts_per_iteration": shape["prompts"], "sampling.n": shape["n"],
          "algo.minibatches": 1, "algo.epochs": 1, "parallel.num_devices": 1,
          "sft.steps": 0, "algo.pack_sequences": pack,
          "run.dir": scratch_dir("rljax-pack-")}
  config = load_config(os.path.join(ROOT, "experiments", "grpo.py"), over)
  run = build(config)
  state = run.params.init_state(run.params.initial_actor)
  return run, state, make_trainer(run, state)


def _batch(rng, shape):
  import numpy as np
  ROWS, PROMPT, COMPLETION = shape["rows"], shape["prompt"], shape["completion"]  # noqa: N806
  p_len = rng.integers(PROMPT // 2, PROMPT + 1, ROWS)
  c_len = np.minimum(rng.geometric(1 / (0.3 * COMPLETION), ROWS), COMPLETION)
  pm = (np.arange(PROMPT)[None] >= PROMPT - p_len[:, None]).astype(np.int32)
  cm = (np.arange(COMPLETION)[None] < c_len[:, None]).astype(np.int32)
  f32 = lambda x: x.astype(np.float32)  # noqa: E731
  vocab = shape["vocab"]
  batch = {"prompt_tokens": (rng.integers(3, vocab, (ROWS, PROMPT)) * pm).astype(np.int32),
           "prompt_mask": pm,
           "tokens": rng.integers(3, vocab, (ROWS, COMPLETION)).astype(np.int32),
           "mask": cm, "old_logp": f32(np.log(rng.uniform(0.001, 0.01, cm.shape)) * cm),
           "ref_logp": f32(np.zeros(cm.shape)),
           "advantages": f32(rng.normal(size=ROWS)[:, None] * cm),
           "returns": f32(np.zeros(cm.shape)), "old_values": f32(np.zeros(cm.shape)),
           "token_weights": f32(np.ones(cm.shape)), "is_weights": f32(np.ones(cm.shape)),
           "rng": np.zeros((ROWS, 2), np.uint32), "kl_coef": np.float32(0.0)}
  return batch, p_len, c_len


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--reps", type=int, default=5)
  ap.add_argument("--reduced", action="store_true",
                  help="seconds: `REDUCED_SHAPE`, --reps 1 (CI's run; measures nothing)")
  args = ap.parse_args()
  if args.reduced:
    args.reps = 1
  shape = REDUCED_SHAPE if args.reduced else SHAPE
  ROWS, PROMPT, COMPLETION = shape["rows"], shape["prompt"], shape["completion"]  # noqa: N806
  sys.path.insert(0, ROOT)
  import jax
  import jax.numpy as jnp
  import numpy as np
  from workload import sig

  load_before = os.getloadavg()[0]
  rng = np.random.default_rng(0)
  batch, p_len, c_len = _batch(rng, shape)
  real = int((p_len + c_len).sum())
  sides = {}
  for name, pack in (("packed", True), ("padded", False)):
    _, state, trainer = _setup(pack, shape)
    mb = {k: jnp.asarray(v) for k, v in batch.items()}
    if pack:
      mb.update(trainer.fns.pack({"prompt_lengths": p_len, "lengths": c_len}, COMPLETION,
                                 PROMPT))
    train = jnp.asarray(True)
    compiled = trainer.update_step.lower(state, mb, train).compile()
    m = compiled.memory_analysis()
    peak = (m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
            - m.alias_size_in_bytes)
    sides[name] = {"trainer": trainer, "state": state, "mb": mb, "peak": peak, "times": [],
                   "rows": int(mb["pack_src"].shape[0]) if pack else ROWS}
  losses = {}
  for i in range(args.reps + 1):
    for name in (("packed", "padded") if i % 2 == 0 else ("padded", "packed")):
      side = sides[name]
      # the same starting state every call (the step donates its input state)
      state = jax.tree.map(jnp.copy, side["state"])
      jax.block_until_ready(state)
      t0 = time.perf_counter()
      _, metrics = side["trainer"].update_step(state, side["mb"], jnp.asarray(True))
      jax.block_until_ready(metrics)
      dt = time.perf_counter() - t0
      if i:
        side["times"].append(dt)
      else:
        losses[name] = float(metrics["loss"])
  np.testing.assert_allclose(losses["packed"], losses["padded"], rtol=1e-4)
  med = {k: statistics.median(v["times"]) for k, v in sides.items()}
  rate = {k: real / med[k] for k in sides}
  mb = 2 ** 20
  result = {"metric": "update_tokens_per_s", "rljax": sig(rate["packed"]),
            "peer": sig(rate["padded"]), "ratio": sig(rate["packed"] / rate["padded"]),
            "packed_s_median": sig(med["packed"]), "padded_s_median": sig(med["padded"]),
            "packed_min_max": [sig(min(sides["packed"]["times"])),
                               sig(max(sides["packed"]["times"]))],
            "padded_min_max": [sig(min(sides["padded"]["times"])),
                               sig(max(sides["padded"]["times"]))],
            "peak_mb_packed": sig(sides["packed"]["peak"] / mb),
            "peak_mb_padded": sig(sides["padded"]["peak"] / mb),
            "shape": shape, "reps": args.reps, "reduced": args.reduced,
            "rows_packed": sides["packed"]["rows"], "rows_padded": ROWS,
            "real_tokens": real, "padded_tokens": ROWS * (PROMPT + COMPLETION),
            "mean_over_max_length": round(real / ROWS / (PROMPT + COMPLETION), 3),
            "loss_packed_padded": [losses["packed"], losses["padded"]],
            "load_avg_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)]}
  print(f"{real} real of {ROWS * (PROMPT + COMPLETION)} padded tokens "
        f"(mean/max {result['mean_over_max_length']}); packed into {result['rows_packed']} rows")
  for k in sides:
    print(f"{k:>7}: {med[k]:.3f} s/step, {rate[k]:,.0f} real tokens/s, "
          f"peak {sides[k]['peak'] / mb:,.0f} MB")
  print("RESULT " + json.dumps(result))


if __name__ == "__main__":
  main()
