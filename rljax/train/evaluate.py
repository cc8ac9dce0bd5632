"""Held-out evaluation: greedy accuracy, avg@k and unbiased pass@k for k = 1..n."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from rljax.ops.stats import pass_at_k
from rljax.train import rollout


def evaluate(ctx, model, prompts, rng, *, n, temperature, batch_size=256):
  """Scores `model` on `prompts`.

  Returns:
    dict with `accuracy` (greedy), `avg@n` (mean accuracy of n samples), `pass@k` for
    k = 1..n (Chen et al. 2021, arXiv:2107.03374, Eq. 1, unbiased), `format`,
    `response_length_mean`.
  """
  greedy = ctx.sampling.replace(greedy=True, n=1)
  sampled = ctx.sampling.replace(n=n, temperature=temperature)
  acc, fmt, lengths, correct, tools = [], [], [], [], []
  keys = jax.random.split(rng, (len(prompts) + batch_size - 1) // batch_size)
  for i, start in enumerate(range(0, len(prompts), batch_size)):
    chunk = prompts[start:start + batch_size]
    rows = rollout.sample_and_score(ctx, model, chunk, keys[i], sampling=greedy)
    acc.append(rows["accuracy"])
    fmt.append(rows["format"])
    lengths.append(rows["lengths"])
    if "tool_calls" in rows:
      tools.append(rows["tool_calls"] > 0)
    if n > 0:
      rows = rollout.sample_and_score(ctx, model, chunk, keys[i], sampling=sampled)
      correct.append(rows["accuracy"].reshape(-1, n))
  out = {"accuracy": float(np.mean(np.concatenate(acc))),
         "format": float(np.mean(np.concatenate(fmt))),
         "response_length_mean": float(np.mean(np.concatenate(lengths)))}
  if tools:   # multi-turn: share of greedy episodes that called a tool
    out["tool_use"] = float(np.mean(np.concatenate(tools)))
  if n > 0:
    c = np.concatenate(correct).sum(axis=1)
    out[f"avg@{n}"] = float(np.mean(c) / n)
    for k in range(1, n + 1):
      out[f"pass@{k}"] = float(np.mean(np.asarray(pass_at_k(n, c, k))))
  return out


def ood_split(setup):
  """(context, prompts) of the out-of-distribution split `task.ood_difficulty` (more terms
  than trained: the "RL generalises, SFT memorises" check of seed 002, after Chu et al.
  2025, arXiv:2501.17161), or None when it is off. Its budget fits the split's worked
  solutions, so a longer reasoning mode is not cut off by the training budget."""
  from rljax.data.tasks import make_task

  t = setup.config.task
  if not t.ood_difficulty:
    return None
  options = {"digits": t.digits} if t.name == "arithmetic" else {}
  task = make_task(t.name, difficulty=t.ood_difficulty, seed=t.seed, n_heldout=t.heldout_size,
                   format_weight=t.format_weight, **options)
  budget = max(setup.ctx.sampling.max_new_tokens, task.max_completion_len + 1)
  prompt_len = max(setup.ctx.prompt_len, task.max_prompt_len + 1)
  ctx = dataclasses.replace(setup.ctx, task=task, prompt_len=prompt_len,
                            sampling=setup.ctx.sampling.replace(max_new_tokens=budget))
  return ctx, task.heldout_prompts()
