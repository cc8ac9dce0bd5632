"""The held-out evaluations of a run: before RL (cached beside the warm start), periodic,
and after RL, with the per-prompt results an ablation pairs by prompt; and `rljax eval
--run DIR`, the latest checkpoint of a finished run evaluated again."""

from __future__ import annotations

import json
import os
import pathlib
import uuid

import jax
import numpy as np

from rljax import parallel
from rljax.train.config import saved_config
from rljax.train.params import Checkpointer
from rljax.train.rollout.evaluate import evaluate, evaluate_per_prompt, evaluate_sets
from rljax.train.run.build import Setup, build

PER_PROMPT_FILE = "heldout_per_prompt.npz"


def evaluate_heldout(setup: Setup, model, key, *, full=False):
  """(summary, per-prompt arrays) on the held-out prompts. `full`: also the
  `task.ood_difficulty` split (as `ood_*`) and pass@large-k (`sampling.eval_passk_n`): the
  evaluations before and after RL; the periodic ones are lighter. The named sets of
  `eval.sets` join the summary as `<name>/<metric>` (every evaluation)."""
  s = setup.specs.rollout
  passk = dict(passk_n=s.eval_passk_n, passk_prompts=s.eval_passk_prompts) if full else {}
  out, per_prompt = evaluate_per_prompt(setup.rollouts, model, setup.heldout_prompts(), key,
                                        n=s.eval_n, temperature=s.eval_temperature, **passk)
  if full and setup.ood is not None:
    rollouts, prompts = setup.ood
    ood = evaluate(rollouts, model, prompts, key, n=s.eval_n, temperature=s.eval_temperature)
    out.update({f"ood_{k}": v for k, v in ood.items()})
  out.update(evaluate_sets(setup.eval_sets, model, key))   # eval.sets: `<name>/<metric>`
  return out, per_prompt


def _cache_path(setup: Setup):
  sft = setup.specs.sft
  if not sft.cache_dir or not sft.heldout_key:
    return None
  return pathlib.Path(sft.cache_dir).absolute() / f"heldout_{sft.heldout_key}.npz"


def evaluate_start(setup: Setup, model, key):
  """The full evaluation of a fresh run's start, read from (or written to) the cache beside
  the warm start: every step of an ablation that shares the start shares it."""
  path = _cache_path(setup)
  # every process reads the cache or none does (the evaluation has collectives)
  if path is not None and not parallel.any_process(not path.exists()):
    with np.load(path) as data:
      arrays = {k: data[k] for k in data.files}
    return json.loads(str(arrays.pop("summary"))), arrays
  summary, per_prompt = evaluate_heldout(setup, model, key, full=True)
  if path is not None and parallel.is_primary():
    write_start_cache(path, summary, per_prompt)
  return summary, per_prompt


def write_start_cache(path: pathlib.Path, summary: dict, per_prompt: dict) -> None:
  """Writes the start's evaluation to `path` atomically. Runs that share the cache (an
  ablation's steps and seeds in parallel processes) may write it at the same moment: each
  writes its own temporary file, and the last `os.replace` wins (same content)."""
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(f"{path.stem}.{uuid.uuid4().hex}.tmp.npz")
  np.savez(tmp, summary=np.asarray(json.dumps(summary)), **per_prompt)
  os.replace(tmp, path)


def save_per_prompt(setup: Setup, run_dir, before: dict, after: dict, *, iteration=None) -> None:
  """`heldout_per_prompt.npz`: the held-out prompts' ids and, before and after RL, each
  prompt's greedy correctness, correct count of `eval_n` samples and of `eval_passk_n`;
  with `iteration`, the periodic evaluation after that iteration
  (`heldout_per_prompt_it<iteration>.npz`: where an ablation's effects stop moving)."""
  arrays = {"prompt_id": np.asarray([p.id for p in setup.heldout_prompts()]),
            "eval_n": np.asarray(setup.specs.rollout.eval_n),
            "passk_n": np.asarray(setup.specs.rollout.eval_passk_n)}
  arrays.update({f"before_{k}": v for k, v in before.items()})
  arrays.update({f"after_{k}": v for k, v in after.items()})
  name = PER_PROMPT_FILE if iteration is None else f"heldout_per_prompt_it{iteration}.npz"
  np.savez(pathlib.Path(run_dir) / name, **arrays)


def evaluate_run(run_dir, *, config=None) -> dict:
  """Held-out accuracy, avg@k and pass@k of the latest readable checkpoint of `run_dir`
  (and of its named evaluation sets, as `<name>/<metric>`): `rljax eval --run DIR`."""
  run_dir = pathlib.Path(run_dir)
  config = config or saved_config(run_dir)
  setup = build(config)
  params = setup.params
  ckpt = Checkpointer(run_dir, keep=setup.specs.run.keep_checkpoints)
  try:
    restored = params.restore(ckpt, params.init_state(params.initial_actor))
  finally:
    ckpt.close()
  if restored is None:
    raise FileNotFoundError(f"no readable checkpoint in {run_dir}/checkpoints")
  s, model = setup.specs.rollout, params.model(restored[1])
  out = evaluate(setup.rollouts, model, setup.heldout_prompts(), jax.random.key(0), n=s.eval_n,
                 temperature=s.eval_temperature)
  out.update(evaluate_sets(setup.eval_sets, model, jax.random.key(0)))   # eval.sets
  return out
