"""Unbiased pass@k curves (k = 1..n) and avg@k from per-prompt correct counts."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from rljax.ops.stats import pass_at_k

_MAX_ELEMENTS = 1 << 22  # prompts × k_max² per compiled call


@functools.lru_cache(maxsize=32)
def _curve_sums_fn(k_max):
  """jit: (n [C], c [C]) -> Σ_prompts pass@k for k = 1..k_max, one compile per k_max."""
  ks = np.arange(1, k_max + 1)[None, :]
  return jax.jit(lambda n, c: jnp.sum(pass_at_k(n[:, None], c[:, None], ks), axis=0))


def correct_counts(correct_pg):
  """Per-prompt correct counts c and sample counts n from a [P, G] correctness array."""
  correct_pg = np.asarray(correct_pg)
  if correct_pg.ndim != 2:
    raise ValueError(f"correct_pg must be [P, G], got shape {correct_pg.shape}")
  return (correct_pg > 0).sum(-1), np.full(correct_pg.shape[0], correct_pg.shape[1])


def pass_at_k_curve(counts_p, n, *, k_max=None):
  """Mean unbiased pass@k over prompts for k = 1..k_max.

  pass@k = E_prompts[1 − C(n − c, k)/C(n, k)] (Chen et al. 2021, "Evaluating Large
  Language Models Trained on Code", arXiv:2107.03374, Eq. 1), one `rljax.ops.stats.pass_at_k`
  call per chunk of prompts for all k at once. pass@1 = mean c/n; pass@n = fraction of prompts with c > 0; non-decreasing
  in k.

  Args:
    counts_p: correct samples per prompt c, int [P], 0 ≤ c ≤ n.
    n: samples per prompt, int or int [P].
    k_max: largest k (default: min n; k cannot exceed any prompt's n).
  Returns:
    float64 [k_max]: entry k − 1 is pass@k.
  """
  c = np.asarray(counts_p, np.int64)
  n_p = np.broadcast_to(np.asarray(n, np.int64), c.shape)
  if c.ndim != 1 or c.size == 0:
    raise ValueError(f"counts_p must be a non-empty [P] array, got shape {c.shape}")
  if np.any(c < 0) or np.any(c > n_p):
    raise ValueError("need 0 <= c <= n for every prompt")
  k_max = int(n_p.min()) if k_max is None else int(k_max)
  if not 1 <= k_max <= n_p.min():
    raise ValueError(f"k_max={k_max} must be in [1, min n = {n_p.min()}]")
  chunk = max(1, min(c.size, _MAX_ELEMENTS // k_max**2))
  pad = -c.size % chunk  # padded prompts have c = 0 and are subtracted out (pass@k = 0)
  c_pad = np.concatenate([c, np.zeros(pad, np.int64)]).reshape(-1, chunk).astype(np.int32)
  n_pad = np.concatenate([n_p, np.full(pad, k_max, np.int64)]).reshape(-1, chunk).astype(np.int32)
  fn = _curve_sums_fn(k_max)
  total = sum(np.asarray(fn(n_i, c_i), np.float64) for n_i, c_i in zip(n_pad, c_pad))
  return total / c.size


def avg_at_k(counts_p, n):
  """avg@n: the mean accuracy of all n samples per prompt, E_prompts[c/n] (= pass@1)."""
  c = np.asarray(counts_p, np.float64)
  return float(np.mean(c / np.broadcast_to(np.asarray(n, np.float64), c.shape)))


def pass_at_k_metrics(counts_p, n, *, prefix="eval/"):
  """Flat dict for metrics.jsonl: f"{prefix}pass@{k}" for k = 1..n and f"{prefix}avg@{n}"."""
  curve = pass_at_k_curve(counts_p, n)
  out = {f"{prefix}pass@{k}": float(v) for k, v in enumerate(curve, start=1)}
  out[f"{prefix}avg@{len(curve)}"] = avg_at_k(counts_p, n)
  return out


def curve_from_record(record, *, prefix="heldout_"):
  """pass@k curve [k_max] from a dict with keys f"{prefix}pass@{k}" (a RESULT line, a
  metrics record or `rljax.train.rollout.evaluate` output with prefix=""); empty if none."""
  ks = sorted(int(key[len(prefix) + 5:]) for key in record
              if key.startswith(f"{prefix}pass@") and key[len(prefix) + 5:].isdigit())
  return np.array([float(record[f"{prefix}pass@{k}"]) for k in ks])
