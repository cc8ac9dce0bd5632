"""Record one real rollout batch for the trick-impact views (analysis_batch.npz).

Builds the run of an experiment file (SFT warm start included), runs ITERATIONS RL
iterations, then collects one more rollout, computes old log-probs, entropies and
advantages exactly as the trainer does (`rljax.train.iteration.prepare`), runs that
iteration's updates and records the updated policy's log-probs as `logp`, so ratios
and clipping are those of a real update.

    python notebooks/capture_batch.py OUT_DIR [ITERATIONS] [EXPERIMENT] [FIELD=VALUE ...]
    RLJAX_BATCH=OUT_DIR/analysis_batch.npz jupyter execute notebooks/analysis.ipynb

Note: uses trainer internals (`rljax.train.loop._fresh_state`); a stop-gap until the
trainer writes the batch itself.
"""

import pathlib
import sys
import time

import jax
import numpy as np
from flax import nnx

from rljax.ops.shaping import RunningMoments
from rljax.train import iteration as it_mod
from rljax.train import rollout
from rljax.train.config import load_config, parse_override_value
from rljax.train.loop import _fresh_state
from rljax.train.setup import build, compile_update


def main(argv):
  out = pathlib.Path(argv[1])
  iterations = int(argv[2]) if len(argv) > 2 else 3
  experiment = argv[3] if len(argv) > 3 else "experiments/grpo.py"
  overrides = {"run.dir": str(out), "run.tensorboard": False, "algo.minibatches": 4}
  for item in argv[4:]:
    key, _, value = item.partition("=")
    overrides[key] = parse_override_value(value)
  out.mkdir(parents=True, exist_ok=True)
  t0 = time.time()
  setup = build(load_config(experiment, overrides))
  fns = it_mod.ForwardFns(setup)
  state = _fresh_state(setup)
  compile_update(setup, state)
  moments = RunningMoments.create()
  for i in range(iterations):
    model = nnx.merge(setup.actor_graphdef, state.actor)
    state, metrics, moments = it_mod.rl_iteration(setup, fns, state, i, moments, model)
    print(f"iteration {i}: reward {metrics['train/reward']:.3f} "
          f"entropy {metrics['update/entropy']:.3f}", flush=True)
  c = setup.config
  keys = it_mod.iteration_keys(state, iterations)
  model = nnx.merge(setup.actor_graphdef, state.actor)
  counter = iter(range(1_000_000))
  rows, _, _ = rollout.collect(
      setup.ctx, model, it_mod.draw_prompts_fn(setup, iterations),
      lambda: jax.random.fold_in(keys["sample"], next(counter)),
      num_prompts=c.sampling.prompts_per_iteration, dynamic_sampling=False, max_rounds=1)
  upd, _, moments = it_mod.prepare(setup, fns, state, rows, keys, moments)
  batch = {k: upd[k] for k in ("prompt_tokens", "prompt_mask", "tokens", "mask")}
  old_logp, entropy = fns.policy_stats(state.actor, batch)
  updated, _ = it_mod.run_updates(setup, state, upd, keys, train_actor=True)
  logp, _ = fns.policy_stats(updated.actor, batch)
  path = out / "analysis_batch.npz"
  np.savez(path, logp=np.asarray(logp), old_logp=np.asarray(old_logp),
           entropy=np.asarray(entropy), advantages=np.asarray(upd["advantages"]),
           mask=np.asarray(upd["mask"], np.float32),
           scores=np.asarray(rows["scores"], np.float64), truncated=np.asarray(rows["truncated"]))
  print(f"wrote {path} in {time.time() - t0:.0f} s")


if __name__ == "__main__":
  main(sys.argv)
