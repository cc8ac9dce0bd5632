"""The training loop: a short function over `rl_iteration`, with resume, evaluation,
checkpoints on Ctrl-C / SIGTERM, and the distillation teacher trained first when the run
names a recipe for it."""

from __future__ import annotations

import json
import pathlib
import signal
import time

import jax
import numpy as np

from rljax import parallel, sampling
from rljax.ops.shaping import RunningMoments
from rljax.train.config import load_config, validate
from rljax.train.config.specs import DistillSpec, distill_spec
from rljax.train.params import Checkpointer
from rljax.train.rollout import make_source
from rljax.train.run import metrics as run_metrics
from rljax.train.run.build import build
from rljax.train.run.heldout import evaluate_heldout, evaluate_start, save_per_prompt
from rljax.train.run.iteration import make_trainer, rl_iteration, save_analysis_batch, warm_start_fn
from rljax.train.run.rejection_sft import RejectionSFT


def _jsonable(tree):
  if isinstance(tree, dict):
    return {k: _jsonable(v) for k, v in tree.items()}
  if hasattr(tree, "tolist"):
    return tree.tolist()
  return tree


class _Session:
  """One call of `train`: the trainer, the checkpointer, the metric writer, the state."""

  def __init__(self, config):
    self.t_start = time.perf_counter()
    setup = self.setup = build(config)   # the specs, task, models, rollouts: all of the run
    spec = setup.specs.run
    self.dir = pathlib.Path(spec.dir)
    self.primary = parallel.is_primary()   # under jax.distributed only process 0 writes
    self.dir.mkdir(parents=True, exist_ok=True)
    if self.primary:
      (self.dir / "config.json").write_text(setup.config_json)
      run_metrics.write_provenance(self.dir)
    self.ckpt = Checkpointer(self.dir, keep=spec.keep_checkpoints)
    self.writer = run_metrics.MetricWriter(self.dir, tensorboard=spec.tensorboard,
                                           enabled=self.primary)
    self.eval_key = jax.random.key(spec.seed + 7)
    self.rsft = None
    rsft = setup.specs.schedule.rsft
    if rsft is not None:
      self.rsft = RejectionSFT(rsft, rollouts=setup.rollouts, task=setup.task,
                               graphdef=setup.params.actor_graphdef, mesh=setup.mesh,
                               seed=spec.seed, teacher=setup.params.teacher)

  def start(self):
    """(state, reward moments, first iteration, held-out metrics before RL).

    Resumes from the newest readable checkpoint (restored into a template with the right
    structure and shardings, so no SFT is redone); otherwise SFT warm start and evaluation.
    """
    params = self.setup.params
    template = params.init_state(params.initial_actor)
    self.trainer = make_trainer(self.setup, template)
    batches, sampler_model = self.setup.batches, params.sampler_model
    restored = params.restore(self.ckpt, template)
    if restored is None:
      state = params.fresh_state(warm_start_fn(self.setup))
      params.save_frozen(self.ckpt, state)
      before, self.before_per_prompt = evaluate_start(self.setup, self.model(state),
                                                      self.eval_key)
      self.source = make_source(batches, sampler_model, state, self.dir, 0)
      return state, RunningMoments.create(), 0, before
    step, state, host = restored
    self.before_per_prompt = {k: np.asarray(v) for k, v in host.get("heldout_per_prompt",
                                                                      {}).items()}
    self.setup.prompt_sampler.load_state_dict(host["prompt_sampler"])
    start = int(state.iteration)
    if self.primary:
      print(f"[rljax] resumed from checkpoint {step} (iteration {start}) in {self.ckpt.directory}")
    moments = RunningMoments(*[jax.numpy.asarray(x) for x in host["reward_moments"]])
    self.source = make_source(batches, sampler_model, state, self.dir, step)
    return state, moments, start, host["heldout_before"]

  def model(self, state):
    """The policy on the sampler's devices (rollouts, RS-FT phases, evaluations)."""
    return self.setup.params.sampler_model(state)[0]

  def compile_count(self) -> int:
    """Programs compiled so far: sampler, forward passes, update step, RS-FT."""
    extra = self.rsft.compile_count() if self.rsft is not None else 0
    return sampling.compile_count() + self.trainer.compile_count() + extra

  def iteration(self, state, it, moments):
    """A rejection-sampling phase when due, one RL iteration, its metrics (and held-out
    ones when due). Raises when too many updates in a row were skipped as non-finite."""
    setup, spec = self.setup, self.setup.specs.run
    t0 = time.perf_counter()
    rsft_metrics = {}
    if self.rsft is not None and it % self.rsft.spec.rsft_every == 0:
      state, rsft_metrics, *_ = self.rsft.phase(state, it, self.model(state))
    state, m, moments, upd = rl_iteration(self.trainer, state, it, moments,
                                          self.source.take(state, it))
    refreshed = setup.params.refresh_reference(state, it)
    if refreshed is not state:
      state, m["kl/ref_refreshed"] = refreshed, 1
    m.update(rsft_metrics)
    skipped_in_row = int(state.nonfinite_in_row)
    if skipped_in_row >= spec.max_nonfinite_in_row:
      raise FloatingPointError(
          f"{skipped_in_row} updates in a row had a non-finite loss or gradient "
          f"(run.max_nonfinite_in_row={spec.max_nonfinite_in_row}); stopping. The last "
          f"good checkpoint in {self.ckpt.directory} is intact.")
    m["compile/programs"] = self.compile_count()
    m["update/skipped_total"] = int(state.skipped_updates)
    self.source.updated(state)
    # the trainer's wall time per iteration (sampling, or waiting for the sampler thread,
    # and the update; held-out evaluation excluded): what asynchronous rollouts can shorten
    m["time/iteration_s"] = time.perf_counter() - t0
    if spec.eval_every and (it + 1) % spec.eval_every == 0:
      heldout, per_prompt = evaluate_heldout(setup, self.model(state), self.eval_key)
      m.update({f"eval/{k}": v for k, v in heldout.items()})
      if self.primary:
        save_per_prompt(setup, self.dir, self.before_per_prompt, per_prompt,
                        iteration=it + 1)
    return state, m, moments, upd

  def host_state(self, before, moments):
    return {"heldout_before": before, "reward_moments": [float(x) for x in moments],
            "prompt_sampler": _jsonable(self.setup.prompt_sampler.state_dict()),
            "heldout_per_prompt": _jsonable(self.before_per_prompt)}

  def finish(self, state, before) -> dict:
    """Plots, result.json (process 0) and the RESULT dict (every process)."""
    setup = self.setup
    after, per_prompt = evaluate_heldout(setup, self.model(state), self.eval_key, full=True)
    if self.primary:
      save_per_prompt(setup, self.dir, self.before_per_prompt, per_prompt)
    if setup.specs.run.plots and self.primary:
      run_metrics.plot_run(self.dir, before=before, after=after)
    result = {"heldout_acc_before": before["accuracy"], "heldout_acc_after": after["accuracy"],
              "wall_s": round(time.perf_counter() - self.t_start, 1),
              "iterations": int(state.iteration)}
    result.update({f"heldout_{k}": v for k, v in after.items() if k != "accuracy"})
    result.update({f"heldout_{k}_before": v for k, v in before.items() if k != "accuracy"})
    if self.primary:
      (self.dir / "result.json").write_text(json.dumps(result, indent=2))
    return result


def train(config, *, stop_after=None):
  """Runs (or resumes) an RL run; returns the RESULT dict.

  Args:
    config: a full config (see rljax.train.config.base_config).
    stop_after: stop (with a checkpoint) after this many iterations of this call; for tests.
  """
  return train_validated(validate(config), stop_after=stop_after)


def train_validated(config, *, stop_after=None):
  """`train` of a config validated already (`load_config` validates: `rljax train`, `rljax
  ablate`)."""
  train_teacher_if_absent(distill_spec(config))   # algo.distill_teacher_recipe, once
  session = _Session(config)
  state, moments, start, before = session.start()
  session.writer.truncate_after(start)
  try:
    state = _loop(session, state, moments, start, before, stop_after)
  finally:
    session.source.close()
    session.ckpt.close()   # waits for an asynchronous save in flight, even on an error
  session.writer.close()
  return session.finish(state, before)


def _loop(session: _Session, state, moments, start, before, stop_after):
  """The iterations of this call, with checkpoints; returns the last state."""
  spec = session.setup.specs.run
  progress = run_metrics.Progress(spec.iterations, start, enabled=spec.progress and session.primary)
  with _StopFlag() as stop:
    for done, it in enumerate(range(start, spec.iterations), start=1):
      state, m, moments, upd = session.iteration(state, it, moments)
      session.writer.write(it + 1, m)
      progress.update(m)
      last = it + 1 == spec.iterations
      # Every process must agree (the checkpoint is collective); a signal may reach one.
      interrupted = (parallel.any_process(stop.raised)
                     or (stop_after is not None and done >= stop_after))
      periodic = spec.save_every and (it + 1) % spec.save_every == 0
      # A state right after a skipped (non-finite) update is never checkpointed.
      if int(state.nonfinite_in_row) == 0 and (last or interrupted or periodic):
        session.source.checkpoint(session.dir, it + 1)   # (first: the sampler state is final)
        session.setup.params.save(session.ckpt, it + 1, state, session.host_state(before, moments))
        session.source.prune(session.dir, session.ckpt.steps() + [it + 1])
      session.source.publish(it + 1)
      if last:
        save_analysis_batch(session.trainer.fns, state, upd, session.dir / "analysis_batch.npz")
      if interrupted:
        break
  progress.close()
  return state


class _StopFlag:
  """Ctrl-C / SIGTERM during a run: finish the current iteration, checkpoint, then stop.

  `with _StopFlag() as stop:` ... `stop.raised` is True once SIGINT or SIGTERM arrived."""

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


def teacher_finished(directory) -> bool:
  """True when `directory` holds a finished rljax run (`train` writes `result.json` last)."""
  return (pathlib.Path(directory) / "result.json").is_file()


def train_teacher_if_absent(spec: DistillSpec | None, train_fn=None):
  """Trains `spec.distill_teacher_recipe` into `spec.distill_teacher` with seed `spec.seed`
  unless it is there.

  With `algo.distill_teacher = "runs/distill_teacher/seed{seed}"` and
  `algo.distill_teacher_recipe = "experiments/grpo.py"`, a run whose teacher directory
  holds no finished run first trains that experiment into it, with the run's own seed;
  every later run (each step of an ablation, a resumed run) finds it there and reuses it,
  as the SFT warm start is cached. An interrupted teacher resumes from its own checkpoints.

  Args:
    spec: the run's distillation spec (None: no distillation, nothing to do).
    train_fn: `train_validated(config)` (a test passes its own).
  Returns:
    the teacher run's RESULT dict when it was trained now, else None.
  """
  if spec is None or not spec.distill_teacher_recipe or teacher_finished(spec.distill_teacher):
    return None
  recipe, teacher = spec.distill_teacher_recipe, spec.distill_teacher
  config = load_config(recipe, {"run.seed": spec.seed, "run.dir": teacher})
  if parallel.is_primary():
    print(f"[rljax] training the distillation teacher: {recipe} (seed {spec.seed}) "
          f"-> {teacher}")
  return (train_fn or train_validated)(config)
