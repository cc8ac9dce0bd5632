"""Held-out evaluation: greedy accuracy, avg@k and unbiased pass@k for k = 1..n."""

from __future__ import annotations

import jax
import numpy as np

from rljax.ops.stats import pass_at_k


def evaluate(rollouts, model, prompts, rng, *, n, temperature, batch_size=256, greedy=True):
  """Scores `model` on `prompts` with the run's rollouts (single-turn or episodic).

  Args:
    greedy: also score the greedy completions (`accuracy`, `format`, lengths, tool use);
      False: the n samples only (a named set of `eval.sets` may skip them).
  Returns:
    dict with `accuracy` (greedy), `avg@n` (mean accuracy of n samples), `pass@k` for
    k = 1..n (Chen et al. 2021, arXiv:2107.03374, Eq. 1, unbiased), `format`,
    `response_length_mean`, and `tool_use` (multi-turn: share of greedy episodes that
    called a tool).
  """
  greedy_sampling = rollouts.ctx.sampling.replace(greedy=True, n=1)
  sampled = rollouts.ctx.sampling.replace(n=n, temperature=temperature)
  acc, fmt, lengths, correct, tools = [], [], [], [], []
  keys = jax.random.split(rng, (len(prompts) + batch_size - 1) // batch_size)
  for i, start in enumerate(range(0, len(prompts), batch_size)):
    chunk = prompts[start:start + batch_size]
    if greedy:
      batch = rollouts.sample_and_score(model, chunk, keys[i], sampling=greedy_sampling)
      acc.append(batch.accuracy)
      fmt.append(batch.format)
      lengths.append(batch.lengths)
      tools.append(batch.tool_use())
    if n > 0:
      batch = rollouts.sample_and_score(model, chunk, keys[i], sampling=sampled)
      correct.append(np.asarray(batch.accuracy).reshape(-1, n))
  out = {}
  if greedy:
    out = {"accuracy": float(np.mean(np.concatenate(acc))),
           "format": float(np.mean(np.concatenate(fmt))),
           "response_length_mean": float(np.mean(np.concatenate(lengths)))}
  if tools and all(t is not None for t in tools):
    out["tool_use"] = float(np.mean(np.concatenate(tools)))
  if n > 0:
    c = np.concatenate(correct).sum(axis=1)
    out[f"avg@{n}"] = float(np.mean(c) / n)
    for k in range(1, n + 1):
      out[f"pass@{k}"] = float(np.mean(np.asarray(pass_at_k(n, c, k))))
  return out
