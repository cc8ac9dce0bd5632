"""Rejection-sampling fine-tuning (RS-FT) phases, alternated with RL iterations.

Touvron et al. 2023, "Llama 2: Open Foundation and Fine-Tuned Chat Models",
arXiv:2307.09288, Sec. 3.2.3 (PPO combined with rejection-sampling fine-tuning): sample K outputs per
prompt from the current policy, keep the one the reward ranks highest, fine-tune on the
kept (prompt, output) pairs; rounds of this alternate with PPO.

One phase: draw `algo.rsft_prompts` train prompts (a function of run seed and iteration),
sample `algo.rsft_k` completions each, score them with the run's reward, keep the best of
each group (`rljax.data.rejection.best_of_k`, optionally only if >= `algo.rsft_min_score`),
then take `algo.rsft_steps` full-batch steps of token-mean NLL on the kept rows.

Note: the optimizer is a separate AdamW (lr `algo.rsft_lr`, b1 0.9, b2 0.99, no weight
decay, global-norm clip 1.0, as the SFT warm start) whose state is created fresh in every
phase, so each phase is a self-contained fine-tune from the current policy; the RL
optimizer state (`state.actor_opt`) is not touched. Only `state.actor` changes, so a
checkpoint holds everything and resume stays exact. Departures from Llama 2: the kept set
is the best of this phase's samples only (Llama 2 later pooled the best samples of all
previous rounds), the sampling temperature is the run's, and the reward is the run's
(verifier + optional reward model) rather than a preference reward model.

With `algo.rsft_from_teacher` the phases sample from on-policy distillation's frozen
teacher (`algo.distill_teacher`) instead of the policy: with `rsft_k = 1` and no
`rsft_min_score` every sample is kept, which is SFT on the teacher's samples (sequence-level
knowledge distillation, Kim & Rush 2016, arXiv:1606.07947, Sec. 3.2).
"""

from __future__ import annotations

import time
from typing import NamedTuple

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from rljax.data.rejection import best_of_k
from rljax.train.config.specs import RejectionSFTSpec
from rljax.train.params.state import clipped_adamw
from rljax.train.update.sft import sft_step_fn, token_mean_nll

SEQUENCE_KEYS = ("prompt_tokens", "prompt_mask", "tokens", "mask")
_STREAM = 0x25F7   # folds the RS-FT sampling key away from the RL iteration's keys


class PhaseResult(NamedTuple):
  state: object        # TrainState with the fine-tuned actor
  metrics: dict        # rsft/* scalars (+ time/rsft_s)
  rows: dict           # the scored samples (K per prompt, group-major)
  batch: dict          # the fixed-shape SFT batch: kept rows first, then mask-0 padding
  kept: np.ndarray     # int [G'] indices into `rows` of the kept completions


def phase_prompts(task, num, seed, iteration):
  """`num` train prompts drawn from (run seed, iteration) alone, so the RL prompt sampler's
  stream (and its checkpointed state) is not disturbed."""
  prompts = task.train_prompts()
  rng = np.random.default_rng([seed, _STREAM, iteration])
  index = rng.choice(len(prompts), num, replace=num > len(prompts))
  return [prompts[i] for i in index]


def phase_key(state, iteration):
  base = jax.random.fold_in(jax.random.wrap_key_data(state.rng), iteration)
  return jax.random.fold_in(base, _STREAM)


def kept_batch(rows, kept, num_rows):
  """SFT batch of fixed shape [num_rows, ...]: the kept rows, then copies of a row with
  completion mask 0 (finite forward pass, no loss), so the phase compiles once.

  Args:
    rows: dict with prompt_tokens/prompt_mask int [B, P], tokens/mask int [B, T].
    kept: int [G'] row indices, G' <= num_rows.
    num_rows: rows of the batch (= prompts per phase).
  Returns:
    dict of NumPy arrays prompt_tokens, prompt_mask [num_rows, P], tokens, mask [num_rows, T].
  """
  if len(kept) > num_rows:
    raise ValueError(f"{len(kept)} kept rows do not fit a batch of {num_rows}")
  filler = np.full(num_rows - len(kept), kept[0] if len(kept) else 0, np.int64)
  index = np.concatenate([np.asarray(kept, np.int64), filler])
  batch = {k: np.asarray(rows[k])[index] for k in SEQUENCE_KEYS}
  batch["mask"] = batch["mask"].copy()
  batch["mask"][len(kept):] = 0
  return batch


class RejectionSFT:
  """The RS-FT phase of a run; its jitted fine-tune is compiled once (fixed batch shape)."""

  def __init__(self, spec: RejectionSFTSpec, *, rollouts, task, graphdef, mesh, seed: int,
               teacher=None):
    self.spec, self.rollouts, self.task = spec, rollouts, task
    self.graphdef, self.mesh, self.seed = graphdef, mesh, seed
    # `algo.rsft_from_teacher`: the distillation teacher samples the phases, not the policy
    self.teacher_model = (teacher.model() if spec.rsft_from_teacher and teacher is not None
                          else None)
    self.tx = clipped_adamw(spec.rsft_lr, b1=0.9, b2=0.99, weight_decay=0.0, grad_clip=1.0)
    self.sampling = rollouts.ctx.sampling.replace(n=spec.rsft_k)
    self._finetune = None

  def _build(self, params):
    """Jits `finetune(params, batch) -> (params, loss before, loss after)`, returning the
    parameters with their input shardings (so the RL update step's cache stays warm)."""
    graphdef, steps, tx = self.graphdef, self.spec.rsft_steps, self.tx
    step = sft_step_fn(graphdef, tx)
    replicated = NamedSharding(self.mesh, PartitionSpec())
    shardings = jax.tree.map(lambda x: x.sharding, params)

    def finetune(params, batch):
      def body(carry, _):
        p, opt = carry
        p, opt, loss = step(p, opt, batch)
        return (p, opt), loss
      (params, _), losses = jax.lax.scan(body, (params, tx.init(params)), None, length=steps)
      return params, losses[0], token_mean_nll(graphdef, params, batch)

    return jax.jit(finetune, out_shardings=(shardings, replicated, replicated))

  def compile_count(self):
    return 0 if self._finetune is None else self._finetune._cache_size()

  def phase(self, state, iteration, model):
    """One RS-FT phase before RL iteration `iteration` (Llama 2, arXiv:2307.09288, Sec. 3.2.3).

    Args:
      state: the run's TrainState; only `actor` changes.
      iteration: the RL iteration about to run (seeds the prompt draw and the sampling key).
      model: the policy `state.actor` merged into a module (for the sampler; the teacher
        samples instead with `algo.rsft_from_teacher`).
    Returns:
      `PhaseResult`: rows have B = rsft_prompts·rsft_k samples; the batch has rsft_prompts
      rows (kept first, mask-0 padding after). Nothing kept: state unchanged, no jit call.
    """
    spec = self.spec
    t0 = time.perf_counter()
    prompts = phase_prompts(self.task, spec.rsft_prompts, self.seed, iteration)
    model = model if self.teacher_model is None else self.teacher_model
    batch = self.rollouts.sample_and_score(model, prompts, phase_key(state, iteration),
                                           sampling=self.sampling)
    rows = {k: getattr(batch, k) for k in SEQUENCE_KEYS + ("scores", "accuracy", "group_id")}
    scores = np.asarray(rows["scores"], np.float64)
    kept = best_of_k(scores, rows["group_id"], min_score=spec.rsft_min_score)
    sft_batch = kept_batch(rows, kept, len(prompts))
    best = scores.reshape(len(prompts), spec.rsft_k).max(axis=1)
    metrics = {"rsft/kept_frac": len(kept) / len(prompts), "rsft/score_mean": scores.mean(),
               "rsft/best_score_mean": best.mean(),
               "rsft/accuracy_mean": float(np.mean(rows["accuracy"])),
               "rsft/kept_tokens": int(sft_batch["mask"].sum()), "rsft/steps": 0}
    if len(kept):
      metrics["rsft/kept_score_mean"] = float(scores[kept].mean())
      metrics["rsft/kept_accuracy"] = float(np.mean(np.asarray(rows["accuracy"])[kept]))
      if self._finetune is None:
        self._finetune = self._build(state.actor)
      actor, before, after = self._finetune(state.actor, sft_batch)
      state = state._replace(actor=actor)
      metrics.update({"rsft/loss_before": float(before), "rsft/loss_after": float(after),
                      "rsft/steps": spec.rsft_steps})
    metrics["time/rsft_s"] = time.perf_counter() - t0
    return PhaseResult(state, metrics, rows, sft_batch, kept)
