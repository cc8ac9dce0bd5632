"""The training loop: a short function over `rl_iteration`, with resume and evaluation."""

from __future__ import annotations

import json
import pathlib
import signal
import time

import jax
import jax.numpy as jnp
from flax import nnx

from rljax import parallel, sampling
from rljax.models.heads import ValueModel
from rljax.ops.shaping import RunningMoments
from rljax.train import checkpoint, metrics, reference, sft
from rljax.train.config import resolve_episode_budget
from rljax.train.evaluate import evaluate, ood_split
from rljax.train.iteration import ForwardFns, rl_iteration, save_analysis_batch
from rljax.train.rejection_sft import RejectionSFT
from rljax.train.setup import build, compile_update, init_state, split_lora
from rljax.train.update import policy_params
from rljax.train.validate import validate


class _StopFlag:
  """Ctrl-C / SIGTERM: finish the current iteration, checkpoint, then stop."""

  def __init__(self):
    self.raised = False
    self._old = {}

  def __enter__(self):
    for sig in (signal.SIGINT, signal.SIGTERM):
      try:
        self._old[sig] = signal.signal(sig, self._handle)
      except ValueError:  # not in the main thread
        pass
    return self

  def _handle(self, signum, frame):
    del frame
    print(f"\n[rljax] signal {signum}: finishing this iteration, then checkpointing")
    self.raised = True

  def __exit__(self, *exc):
    for sig, old in self._old.items():
      signal.signal(sig, old)


def _jsonable(tree):
  if isinstance(tree, dict):
    return {k: _jsonable(v) for k, v in tree.items()}
  if hasattr(tree, "tolist"):
    return tree.tolist()
  return tree


def compile_count(setup, fns, rsft=None):
  """Programs compiled so far by the sampler, the forward passes, the update step and the
  rejection-sampling fine-tune (when on)."""
  extra = rsft.compile_count() if rsft is not None else 0
  return sampling.compile_count() + fns.compile_count() + setup.update_step._cache_size() + extra


def _evaluate(setup, state, seed_key, *, with_ood=False):
  """Held-out metrics; with `with_ood` also the task.ood_difficulty split as `ood_*`."""
  c = setup.config
  model = nnx.merge(setup.actor_graphdef, policy_params(state))
  out = evaluate(setup.ctx, model, setup.task.heldout_prompts(), seed_key,
                 n=c.sampling.eval_n, temperature=c.sampling.eval_temperature)
  split = ood_split(setup) if with_ood else None
  if split is not None:
    ood = evaluate(split[0], model, split[1], seed_key, n=c.sampling.eval_n,
                   temperature=c.sampling.eval_temperature)
    out.update({f"ood_{k}": v for k, v in ood.items()})
  return out


def _fresh_state(setup):
  """SFT warm start; a PPO critic starts from a reward model (algo.critic_init_path, seed
  001) or else from the SFT policy's trunk."""
  c = setup.config
  trainable, frozen = split_lora(setup, setup.initial_actor)
  if frozen is None:
    actor = sft.warm_start(setup, trainable)
  else:   # LoRA: the warm start trains the base; the fresh adapters (B = 0) stay as they are
    actor = nnx.merge_state(sft.warm_start(setup, frozen, frozen=(trainable,)), trainable)
  if setup.initial_critic is not None and not c.algo.critic_init_path:
    policy = nnx.merge(setup.actor_graphdef, actor)
    critic = ValueModel.from_policy(policy, rngs=nnx.Rngs(c.run.seed + 1))
    setup.initial_critic = nnx.state(parallel.shard_model(critic, setup.mesh))
  with_ref = c.algo.kl_placement != "none"
  return init_state(setup, actor, with_reference=with_ref)


def train(config, *, stop_after=None):
  """Runs (or resumes) an RL run; returns the RESULT dict.

  Args:
    config: a full config (see rljax.train.config.base_config).
    stop_after: stop (with a checkpoint) after this many iterations of this call; for tests.
  """
  resolve_episode_budget(config)
  validate(config)
  t_start = time.perf_counter()
  setup = build(config)
  c = config
  run_dir = pathlib.Path(c.run.dir)
  primary = parallel.is_primary()   # under jax.distributed only process 0 writes files
  run_dir.mkdir(parents=True, exist_ok=True)
  if primary:
    (run_dir / "config.json").write_text(c.to_json_best_effort(indent=2, sort_keys=True))
  ckpt = checkpoint.Checkpointer(run_dir, keep=c.run.keep_checkpoints)
  writer = metrics.MetricWriter(run_dir, tensorboard=c.run.tensorboard, enabled=primary)
  fns = ForwardFns(setup)
  eval_key = jax.random.key(c.run.seed + 7)
  rsft = RejectionSFT(setup) if c.algo.rsft_every else None

  state, moments, start, before = _start(setup, ckpt, eval_key)
  writer.truncate_after(start)

  def host_state():
    return {"heldout_before": before, "reward_moments": [float(x) for x in moments],
            "prompt_sampler": _jsonable(setup.prompt_sampler.state_dict())}

  iterations = range(start, c.run.iterations)
  progress = c.run.progress and primary
  if progress:
    from tqdm import tqdm
    iterations = tqdm(iterations, desc="RL", initial=start, total=c.run.iterations)
  done = 0
  try:
    with _StopFlag() as stop:
      for it in iterations:
        state, m, moments, upd = _iteration(setup, fns, rsft, state, it, moments, eval_key,
                                            ckpt.directory)
        skipped_in_row = int(state.nonfinite_in_row)
        writer.write(it + 1, m)
        if progress:
          iterations.set_postfix(reward=f"{m['train/reward']:.2f}",
                                 acc=f"{m['train/accuracy']:.2f}",
                                 ent=f"{m['update/entropy']:.2f}",
                                 len=f"{m['train/response_length_mean']:.1f}")
        done += 1
        last = it + 1 == c.run.iterations
        # Every process must agree (the checkpoint is collective); a signal may reach one.
        interrupted = (parallel.any_process(stop.raised)
                       or (stop_after is not None and done >= stop_after))
        periodic = c.run.save_every and (it + 1) % c.run.save_every == 0
        # A state right after a skipped (non-finite) update is never checkpointed.
        if skipped_in_row == 0 and (last or interrupted or periodic):
          ckpt.save(it + 1, state._replace(base=None), host_state())
        if last:
          save_analysis_batch(fns, state, upd, run_dir / "analysis_batch.npz")
        if interrupted:
          break
  finally:
    ckpt.close()   # waits for an asynchronous save in flight, even when stopping on an error
  writer.close()
  return _finish(setup, state, before, _evaluate(setup, state, eval_key, with_ood=True),
                 t_start)


def _iteration(setup, fns, rsft, state, it, moments, eval_key, ckpt_dir):
  """A rejection-sampling phase when due, one RL iteration, its metrics (and held-out ones
  when due). Returns (state, metrics, reward moments, update batch); raises when too many
  updates in a row were skipped as non-finite."""
  c = setup.config
  rsft_metrics = {}
  if rsft is not None and it % c.algo.rsft_every == 0:
    model = nnx.merge(setup.actor_graphdef, state.actor)
    state, rsft_metrics, *_ = rsft.phase(state, it, model)
  model = nnx.merge(setup.actor_graphdef, policy_params(state))
  state, m, moments, upd = rl_iteration(setup, fns, state, it, moments, model)
  if reference.refresh_due(c.algo, it):
    state = reference.refresh_reference(setup, state, it)
    m["kl/ref_refreshed"] = 1
  m.update(rsft_metrics)
  skipped_in_row = int(state.nonfinite_in_row)
  if skipped_in_row >= c.run.max_nonfinite_in_row:
    raise FloatingPointError(
        f"{skipped_in_row} updates in a row had a non-finite loss or gradient "
        f"(run.max_nonfinite_in_row={c.run.max_nonfinite_in_row}); stopping. The last "
        f"good checkpoint in {ckpt_dir} is intact.")
  m["compile/programs"] = compile_count(setup, fns, rsft)
  m["update/skipped_total"] = int(state.skipped_updates)
  if c.run.eval_every and (it + 1) % c.run.eval_every == 0:
    m.update({f"eval/{k}": v for k, v in _evaluate(setup, state, eval_key).items()})
  return state, m, moments, upd


def _start(setup, ckpt, eval_key):
  """(state, reward moments, first iteration, held-out metrics before RL).

  Resumes from the newest readable checkpoint (restored into a template with the right
  structure and shardings, so no SFT is redone); otherwise SFT warm start and evaluation.
  """
  with_ref = setup.config.algo.kl_placement != "none"
  template = init_state(setup, setup.initial_actor, with_reference=with_ref)
  compile_update(setup, template)
  restored = ckpt.restore_latest(template._replace(base=None))
  base = None if template.base is None else ckpt.restore_frozen(template.base)
  if restored is None or (template.base is not None and base is None):
    state = _fresh_state(setup)
    if state.base is not None:
      ckpt.save_frozen(state.base)
    return state, RunningMoments.create(), 0, _evaluate(setup, state, eval_key,
                                                        with_ood=True)
  step, state, host = restored
  state = state._replace(base=base)
  setup.prompt_sampler.load_state_dict(host["prompt_sampler"])
  start = int(state.iteration)
  if parallel.is_primary():
    print(f"[rljax] resumed from checkpoint {step} (iteration {start}) in {ckpt.directory}")
  moments = RunningMoments(*[jnp.asarray(x) for x in host["reward_moments"]])
  return state, moments, start, host["heldout_before"]


def _finish(setup, state, before, after, t_start):
  """Plots, result.json (process 0) and the RESULT dict (every process)."""
  run_dir = pathlib.Path(setup.config.run.dir)
  primary = parallel.is_primary()
  if setup.config.run.plots and primary:
    metrics.plot_run(run_dir, before=before, after=after)
  result = {"heldout_acc_before": before["accuracy"], "heldout_acc_after": after["accuracy"],
            "wall_s": round(time.perf_counter() - t_start, 1),
            "iterations": int(state.iteration)}
  result.update({f"heldout_{k}": v for k, v in after.items() if k != "accuracy"})
  result.update({f"heldout_{k}_before": v for k, v in before.items() if k != "accuracy"})
  if primary:
    (run_dir / "result.json").write_text(json.dumps(result, indent=2))
  return result
