"""Dynamic-sampling buffer (DAPO, Yu et al. 2025, arXiv:2503.14476, Sec. 3.2, Eq. 11).

DAPO over-samples and filters out prompts whose completions all have the same accuracy
(0 < |{o_i : is_equivalent(a, o_i)}| < G), since such groups give zero advantage and no
gradient. As in verl's DAPO recipe (dapo_ray_trainer.py): keep a group iff
`np.std(scores) > 0 or len(group) == 1`; keep generating batches until the target
number of groups is filled; raise once the number of generation rounds reaches
`max_rounds` (<= 0: no limit); truncate to the target.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class DynamicSamplingError(RuntimeError):
  """Too many generation rounds without filling the target number of groups."""


def group_keep_mask(scores_b, group_id_b) -> np.ndarray:
  """Per-sample mask of groups that carry signal: std(scores of the group) > 0 or size 1.

  Args:
    scores_b: float [B], the filter metric of each completion (e.g. accuracy).
    group_id_b: int [B], equal ids mark completions of the same prompt.
  Returns:
    bool [B], True for every sample of a kept group.
  """
  scores, gid = np.asarray(scores_b, np.float64), np.asarray(group_id_b)
  if scores.shape != gid.shape or scores.ndim != 1:
    raise ValueError(f"group_keep_mask: scores {scores.shape} and group_id {gid.shape} must be "
                     "equal 1-D shapes")
  keep = np.zeros(len(scores), bool)
  for g in np.unique(gid):
    m = gid == g
    keep[m] = m.sum() == 1 or np.std(scores[m]) > 0
  return keep


def _take(x, idx):
  if isinstance(x, (list, tuple)):
    return [x[i] for i in idx]
  return np.asarray(x)[idx]


def _concat(parts):
  if isinstance(parts[0], list):
    return [v for p in parts for v in p]
  return np.concatenate(parts, axis=0)


class DynamicSamplingBuffer:
  """Accumulates kept groups over generation rounds until `target_groups` are filled.

  Usage, per training step:
    buf = DynamicSamplingBuffer(target_groups=B, max_rounds=10)
    while not buf.ready:
      rollout, scores = generate_and_score(...)
      buf.add(scores, rollout.group_id, tokens=..., mask=..., ...)
    batch = buf.take()   # arrays with target_groups groups, group ids renumbered 0..B-1

  Args:
    target_groups: number of groups (prompts) per training batch.
    max_rounds: raise after this many `add` calls without reaching the target (<= 0: never).
  """

  def __init__(self, target_groups: int, *, max_rounds: int = 10):
    if target_groups <= 0:
      raise ValueError(f"target_groups must be > 0, got {target_groups}")
    self.target_groups, self.max_rounds = int(target_groups), int(max_rounds)
    self.last_stats: dict = {}
    self.reset()

  def reset(self) -> None:
    """Drops stored groups and zeroes the round counters."""
    self.groups: list[dict] = []
    self.rounds = self.groups_seen = self.groups_passed = self.samples_seen = 0

  @property
  def ready(self) -> bool:
    return len(self.groups) >= self.target_groups

  def add(self, scores_b, group_id_b, **arrays) -> int:
    """Filters one generation round and stores its kept groups.

    Args:
      scores_b: float [B], filter metric per completion.
      group_id_b: int [B].
      **arrays: per-sample data with leading dim B (NumPy/JAX arrays or lists).
    Returns:
      number of groups kept from this round.
    Raises:
      DynamicSamplingError: if the target is still not reached after `max_rounds` rounds.
    """
    gid = np.asarray(group_id_b)
    for k, v in arrays.items():
      if len(v) != len(gid):
        raise ValueError(f"DynamicSamplingBuffer.add: {k} has {len(v)} rows, expected {len(gid)}")
    keep = group_keep_mask(scores_b, gid)
    self.rounds += 1
    self.samples_seen += len(gid)
    kept = 0
    scores = np.asarray(scores_b)
    for g in dict.fromkeys(gid.tolist()):  # first-appearance order
      self.groups_seen += 1
      idx = np.flatnonzero(gid == g)
      self.groups_passed += bool(keep[idx[0]])
      if keep[idx[0]] and not self.ready:
        self.groups.append({"scores": scores[idx], **{k: _take(v, idx) for k, v in arrays.items()}})
        kept += 1
    if not self.ready and 0 < self.max_rounds <= self.rounds:
      raise DynamicSamplingError(
        f"dynamic sampling: only {len(self.groups)}/{self.target_groups} groups with non-zero "
        f"score variance after {self.rounds} rounds (max_rounds={self.max_rounds}; "
        f"{self.groups_seen} groups seen). The task is too easy or too hard for the policy: "
        "change the difficulty, raise max_rounds, or turn dynamic sampling off.")
    return kept

  def take(self) -> dict:
    """The first `target_groups` kept groups, concatenated; then `reset()`.

    The counters of the finished step are kept in `last_stats`.

    Returns:
      dict with "scores", "group_id" (renumbered 0..target_groups-1) and every array given
      to `add`, each with the rows of the kept groups, group by group.
    """
    if not self.ready:
      raise RuntimeError(f"take(): {len(self.groups)}/{self.target_groups} groups filled")
    groups = self.groups[:self.target_groups]
    out = {k: _concat([g[k] for g in groups]) for k in groups[0]}
    out["group_id"] = np.concatenate([np.full(len(g["scores"]), i, np.int32)
                                      for i, g in enumerate(groups)])
    self.last_stats = self.stats()
    self.reset()
    return out

  def stats(self) -> dict:
    """Counters for metrics: rounds, groups seen / kept, fraction of groups filtered."""
    return {"rounds": self.rounds, "groups_seen": self.groups_seen,
            "groups_kept": min(len(self.groups), self.target_groups),
            "filtered_fraction": 1.0 - self.groups_passed / max(self.groups_seen, 1)}


def filter_groups_bg(scores_bg) -> np.ndarray:
  """Keep mask over prompts for a [B, G] score array (std over G > 0, or G == 1) -> bool [B]."""
  s = np.asarray(scores_bg, np.float64)
  if s.ndim != 2:
    raise ValueError(f"filter_groups_bg: expected [B, G], got shape {s.shape}")
  return (np.std(s, axis=1) > 0) | (s.shape[1] == 1)


__all__: Sequence[str] = ("DynamicSamplingBuffer", "DynamicSamplingError", "filter_groups_bg",
                          "group_keep_mask")
