"""Per-turn views of a multi-turn batch: turn-level returns and advantages
(`algo.turn_rewards`), the per-turn sampler-trainer gap, the episodes' metrics."""

from __future__ import annotations

import math

import jax
import numpy as np

from rljax.ops.turns import turn_advantages
from rljax.train.rollout.batch import RolloutBatch


def turn_inputs(episodes, mask):
  """The per-turn rewards of `rljax.ops.turns.turn_advantages` from the episode records.

  Turn k's step reward sits on its last sampled token; a last turn that never reached the
  environment (sampled tokens after the last answered turn: the budget ran out mid-turn)
  is a turn of its own with step reward 0. A turn whose environment call failed has
  reward 0.

  Args:
    mask: the sampled tokens, [B, T].
  Returns:
    (turn_rewards float32 [B, K], turn_mask [B, K], token_turn int32 [B, T]) as NumPy.
  """
  mask = np.asarray(mask) > 0
  b, columns = mask.shape
  ends_of = []
  for i, ep in enumerate(episodes):
    ends = list(ep.turn_ends)
    if not ends or mask[i, ends[-1]:].any():
      ends.append(columns)
    ends_of.append(ends)
  k = max(len(e) for e in ends_of)
  rewards = np.zeros((b, k), np.float32)
  exists = np.zeros((b, k), np.float32)
  token_turn = np.zeros((b, columns), np.int32)
  for i, (ep, ends) in enumerate(zip(episodes, ends_of)):
    step_rewards = list(ep.step_rewards)[:len(ep.turn_ends)]
    rewards[i, :len(step_rewards)] = step_rewards
    exists[i, :len(ends)] = 1.0
    start = 0
    for turn, end in enumerate(ends):
      token_turn[i, start:end] = turn
      start = end
  return rewards, exists, token_turn


def turn_logp_gap(episodes, sampler_logp, old_logp, mask) -> dict:
  """Mean |sampler − trainer| log-prob gap of the sampled tokens of each turn index
  (`mismatch/turn<k>_logp_gap`): token-in-token-out keeps it at float precision."""
  gaps = {}
  diff = np.abs(np.asarray(old_logp) - np.asarray(sampler_logp)) * (np.asarray(mask) > 0)
  for i, ep in enumerate(episodes):
    start = 0
    for k, end in enumerate(ep.turn_ends + [diff.shape[1]]):
      sel = np.asarray(mask[i, start:end]) > 0
      if sel.any():
        gaps.setdefault(k, []).append(float(diff[i, start:end][sel].mean()))
      start = end
  return {f"mismatch/turn{k}_logp_gap": float(np.mean(v)) for k, v in sorted(gaps.items())
          if not math.isnan(np.mean(v))}


_turn_advantages = jax.jit(turn_advantages, static_argnames=("gamma", "group_size"))


def turn_reward_advantages(batch: RolloutBatch, inputs, gamma: float, group: int):
  """`algo.turn_rewards`: per-token advantages from the episodes' per-turn rewards
  (`rljax.ops.turns.turn_advantages`); the verifier's part of the (shaped) score sits on the
  last turn; rows that are not `valid` get 0.

  Args:
    inputs: the `UpdateBatch`: `completion_mask` [B, T], shaped `scores` [B], `valid` [B].
  """
  mask = np.asarray(inputs.completion_mask)
  rewards, exists, token_turn = turn_inputs(batch.episodes.episodes, mask)
  final = np.asarray(inputs.scores) - np.asarray(batch.components["env"])
  adv = _turn_advantages(rewards, exists, token_turn, final.astype(np.float32), mask,
                         gamma=gamma, group_size=group)
  return adv * inputs.valid[:, None]


def episode_metrics(batch: RolloutBatch, upd, *, with_logp_gap: bool) -> dict:
  """Turns, tools, terminations and the per-turn sampler-trainer log-prob gap of a
  multi-turn batch ({} for single-turn rows)."""
  if batch.episodes is None:
    return {}
  metrics = dict(batch.episodes.metrics)
  if with_logp_gap:
    metrics.update(turn_logp_gap(batch.episodes.episodes, np.asarray(upd.sampler_logp),
                                 np.asarray(upd.old_logp), np.asarray(upd.completion_mask)))
  return metrics
