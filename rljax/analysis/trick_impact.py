"""Trick impact: which tokens and sequences a loss variant promotes or suppresses.

Before using a trick, know which tokens the new loss promotes or suppresses; a trick
whose effect on the token distribution cannot be told is not worth adding.
`impact_report` compares the effective per-token gradient weights w_t
(`rljax.analysis.loss_weights.effective_weights`, ∇_θ L = −Σ_t w_t ∇_θ log π_θ(y_t)) under a
variant and under a baseline and buckets the change Δw by token probability, entropy
and advantage sign, and by sequence length and score.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from rljax.analysis.loss_weights import (
    LossVariant,
    as_variant,
    effective_weights,
    policy_spec,
    variant_from_config,
)

# The variants and their weights live in `loss_weights`; this module's public names include them.
__all__ = ["DEFAULT_ENTROPY_QUANTILES", "DEFAULT_PROB_EDGES", "ImpactReport", "LossVariant",
           "SIGN_LABELS", "SequenceBuckets", "as_variant", "effective_weights",
           "format_impact_table", "impact_report", "policy_spec", "variant_from_config"]

SIGN_LABELS = ("A>0", "A<0")
DEFAULT_PROB_EDGES = (0.0, 0.1, 0.5, 0.9, 1.0)
DEFAULT_ENTROPY_QUANTILES = (0.5, 0.8)  # low half, middle, top 20% ("forking" tokens)


@dataclasses.dataclass(frozen=True)
class SequenceBuckets:
  """Per-bucket sums over sequences of Σ_t |w_t| (influence) and Σ_t w_t (net push).

  Attributes:
    by: what the buckets split ("length" or "score").
    labels: bucket labels, K strings.
    count: sequences per bucket, int [K].
    base_abs, trick_abs: Σ over the bucket's sequences of Σ_t |w_t|, float [K].
    base_net, trick_net: Σ over the bucket's sequences of Σ_t w_t, float [K].
  """

  by: str
  labels: tuple[str, ...]
  count: np.ndarray
  base_abs: np.ndarray
  trick_abs: np.ndarray
  base_net: np.ndarray
  trick_net: np.ndarray

  @property
  def delta_abs(self):
    return self.trick_abs - self.base_abs

  @property
  def delta_net(self):
    return self.trick_net - self.base_net


@dataclasses.dataclass(frozen=True)
class ImpactReport:
  """What a variant changes relative to a baseline on one batch (NumPy arrays).

  Token grids are indexed [sign, prob bucket, entropy bucket] with sign 0 = A > 0 and
  1 = A < 0 (tokens with A = 0 are left out of the grid).

  Attributes:
    base_name, trick_name: variant names.
    w_base_bt, w_trick_bt: effective weights, float32 [B, T].
    prob_labels, entropy_labels: bucket labels (probability = exp(old_logp)).
    token_count: valid tokens per cell, int [2, P, E].
    token_base_sum, token_trick_sum: Σ w per cell, float [2, P, E].
    token_delta_sum: Σ (w_trick − w_base) per cell, float [2, P, E].
    token_delta_mean: mean (w_trick − w_base) per cell (0 for empty cells), [2, P, E].
    total_abs_base: Σ_t |w_base|, the scale that tables express shares in.
    lengths, scores: SequenceBuckets by completion length and by score.
  """

  base_name: str
  trick_name: str
  w_base_bt: np.ndarray
  w_trick_bt: np.ndarray
  prob_labels: tuple[str, ...]
  entropy_labels: tuple[str, ...]
  token_count: np.ndarray
  token_base_sum: np.ndarray
  token_trick_sum: np.ndarray
  token_delta_sum: np.ndarray
  token_delta_mean: np.ndarray
  total_abs_base: float
  lengths: SequenceBuckets
  scores: SequenceBuckets


def _edge_labels(edges, fmt):
  return tuple(f"[{fmt(lo)}, {fmt(hi)}{']' if i == len(edges) - 2 else ')'}"
               for i, (lo, hi) in enumerate(zip(edges[:-1], edges[1:])))


def _digitize(x, edges):
  """Bucket index in 0..len(edges)-2 for [e_i, e_{i+1}) (last bucket closed)."""
  return np.clip(np.digitize(x, np.asarray(edges)[1:-1], right=False), 0, len(edges) - 2)


def _value_buckets(values, edges, *, max_unique=5, quantiles=(0.25, 0.5, 0.75)):
  """(index [N], labels): one bucket per distinct value when there are few, else edges.

  Without explicit `edges`, ≤ `max_unique` distinct values get a bucket each; otherwise
  the edges are the min, the given quantiles and the max of `values`.
  """
  values = np.asarray(values, np.float64)
  fmt = lambda x: f"{x:.3g}"
  if edges is None:
    unique = np.unique(values)
    if len(unique) <= max_unique:
      return np.searchsorted(unique, values), tuple(fmt(u) for u in unique)
    edges = np.unique(np.quantile(values, (0.0, *quantiles, 1.0)))
  edges = np.asarray(edges, np.float64)
  return _digitize(values, edges), _edge_labels(edges, fmt)


def _sequence_buckets(by, index, labels, w_base, w_trick):
  k = len(labels)
  sums = lambda per_seq: np.bincount(index, weights=per_seq, minlength=k)[:k]
  return SequenceBuckets(
      by=by, labels=labels, count=np.bincount(index, minlength=k)[:k],
      base_abs=sums(np.abs(w_base).sum(-1)), trick_abs=sums(np.abs(w_trick).sum(-1)),
      base_net=sums(w_base.sum(-1)), trick_net=sums(w_trick.sum(-1)))


def _token_grid(values_bt, sign_i, prob_i, ent_i, keep, shape):
  grid = np.zeros(shape, np.float64)
  np.add.at(grid, (sign_i[keep], prob_i[keep], ent_i[keep]), values_bt[keep])
  return grid


def impact_report(trick, base, *, logp_bt, old_logp_bt, advantages, mask, entropy_bt,
                 scores_b=None, truncated_b=None, prob_edges=DEFAULT_PROB_EDGES,
                 entropy_edges=None, length_edges=None, score_edges=None):
  """Effective-weight change of `trick` relative to `base` on one batch, bucketed.

  Tokens are bucketed by the sampling probability p = exp(old_logp) (`prob_edges`), by
  entropy (`entropy_edges`; default: the batch's 50th and 80th percentiles, so the last
  bucket holds the top-20% "forking" tokens of Wang et al. 2025, arXiv:2506.01939) and by
  advantage sign; sequences by length and by score (few distinct values: one bucket each;
  otherwise quartiles, or the given edges).

  Args:
    trick, base: LossVariant or dict of its fields.
    logp_bt: current-policy log-probs of the sampled tokens, [B, T] (the point at which
      the gradient is taken; equal to `old_logp_bt` for the first on-policy step).
    old_logp_bt: sampling-policy log-probs, [B, T].
    advantages: [B] or [B, T].
    mask: completion mask, [B, T].
    entropy_bt: per-token entropy of the sampling policy, [B, T].
    scores_b: per-sequence scores [B]; default: the sequence's mean advantage.
    truncated_b: bool [B], needed by variants with the overlong filter.
    prob_edges, entropy_edges, length_edges, score_edges: bucket edges (ascending).
  Returns:
    ImpactReport.
  """
  trick, base = as_variant(trick), as_variant(base)
  kw = dict(entropy_bt=entropy_bt, truncated_b=truncated_b)
  w_base = effective_weights(base, logp_bt, old_logp_bt, advantages, mask, **kw)
  w_trick = effective_weights(trick, logp_bt, old_logp_bt, advantages, mask, **kw)
  valid = np.asarray(mask) > 0
  adv = np.asarray(advantages, np.float64)
  adv = np.broadcast_to(adv[:, None], valid.shape) if adv.ndim == 1 else adv
  ent = np.where(valid, np.asarray(entropy_bt, np.float64), 0.0)
  if entropy_edges is None:
    q = np.quantile(ent[valid], DEFAULT_ENTROPY_QUANTILES) if valid.any() else (0.0, 0.0)
    entropy_edges = (min(0.0, float(ent.min())), *q, max(float(ent.max()), float(q[-1])))
  prob = np.exp(np.where(valid, np.asarray(old_logp_bt, np.float64), 0.0))
  sign_i = np.where(adv > 0, 0, 1)
  prob_i, ent_i = _digitize(prob, prob_edges), _digitize(ent, entropy_edges)
  keep = valid & (adv != 0)
  shape = (2, len(prob_edges) - 1, len(entropy_edges) - 1)
  grid = lambda x: _token_grid(np.asarray(x, np.float64), sign_i, prob_i, ent_i, keep, shape)
  count = grid(np.ones(valid.shape)).astype(np.int64)
  delta = grid(w_trick.astype(np.float64) - w_base)
  lengths = valid.sum(-1)
  if scores_b is None:
    scores_b = np.where(lengths > 0, (adv * valid).sum(-1) / np.maximum(lengths, 1), 0.0)
  len_i, len_labels = _value_buckets(lengths, length_edges)
  score_i, score_labels = _value_buckets(scores_b, score_edges)
  return ImpactReport(
      base_name=base.name, trick_name=trick.name, w_base_bt=w_base, w_trick_bt=w_trick,
      prob_labels=_edge_labels(prob_edges, lambda x: f"{x:.2g}"),
      entropy_labels=_edge_labels(entropy_edges, lambda x: f"{x:.2f}"),
      token_count=count, token_base_sum=grid(w_base), token_trick_sum=grid(w_trick),
      token_delta_sum=delta, token_delta_mean=np.where(count > 0, delta / np.maximum(count, 1), 0.0),
      total_abs_base=float(np.abs(w_base).sum()),
      lengths=_sequence_buckets("length", len_i, len_labels, w_base, w_trick),
      scores=_sequence_buckets("score", score_i, score_labels, w_base, w_trick))


def _effect(delta, tol):
  return "promotes" if delta > tol else ("suppresses" if delta < -tol else "unchanged")


def _pct(x, scale):
  return f"{100.0 * x / scale:+.2f}%" if scale > 0 else "n/a"


def format_impact_table(report: ImpactReport) -> str:
  """Markdown: per token bucket and per sequence bucket, the weight change Δw.

  Shares are Δ as a percentage of Σ_t |w_base| (the baseline's total gradient weight),
  so tables of different batches and loss scales compare. "promotes" means Δw > 0: the
  trick pushes those tokens' log-probs up more (or down less) than the baseline.
  """
  scale, tol = report.total_abs_base, 1e-6 * max(report.total_abs_base, 1e-30)
  lines = [f"### {report.trick_name} vs {report.base_name}", "",
           "w = −∂L/∂logπ_t (w > 0 raises the token's log-prob). Shares are % of "
           f"Σ|w_base| = {scale:.4g}.", "",
           "| A | p_old | entropy | tokens | Σw base | Σw trick | ΔΣw share | mean Δw | effect |",
           "|---|---|---|---|---|---|---|---|---|"]
  for s, sign in enumerate(SIGN_LABELS):
    for p, p_label in enumerate(report.prob_labels):
      for e, e_label in enumerate(report.entropy_labels):
        n = report.token_count[s, p, e]
        if n == 0:
          continue
        d = report.token_delta_sum[s, p, e]
        lines.append(
            f"| {sign} | {p_label} | {e_label} | {n} | {report.token_base_sum[s, p, e]:.4g} | "
            f"{report.token_trick_sum[s, p, e]:.4g} | {_pct(d, scale)} | "
            f"{report.token_delta_mean[s, p, e]:.3g} | {_effect(d, tol)} |")
  for buckets in (report.lengths, report.scores):
    lines += ["", f"| {buckets.by} | sequences | Σ|w| base | Σ|w| trick | Δ Σ|w| share | "
              "Δ net Σw share | effect |", "|---|---|---|---|---|---|---|"]
    for i, label in enumerate(buckets.labels):
      if buckets.count[i] == 0:
        continue
      d = buckets.delta_abs[i]
      effect = "gains weight" if d > tol else ("loses weight" if d < -tol else "unchanged")
      lines.append(
          f"| {label} | {buckets.count[i]} | {buckets.base_abs[i]:.4g} | "
          f"{buckets.trick_abs[i]:.4g} | {_pct(d, scale)} | "
          f"{_pct(buckets.delta_net[i], scale)} | {effect} |")
  return "\n".join(lines) + "\n"
