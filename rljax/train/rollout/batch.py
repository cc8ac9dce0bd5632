"""The typed batch every rollout returns, single-turn or episodic, and the per-turn views of
a multi-turn batch: turn-level returns and advantages (`algo.turn_rewards`), the per-turn
sampler-trainer gap, the episodes' metrics."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import numpy as np

from rljax.envs import STATUSES
from rljax.ops.turns import turn_advantages

# Sequence arrays: global `jax.Array`s whose rows are split over the mesh's batch axes.
SEQUENCE_FIELDS = ("prompt_tokens", "prompt_mask", "tokens", "mask", "sampler_logp",
                   "truncated")
# Per-row host arrays: every process holds all B rows as NumPy.
ROW_FIELDS = ("scores", "accuracy", "format", "reward_failed", "lengths", "prompt_lengths",
              "extent", "group_id")


@dataclasses.dataclass
class EpisodeRecords:
  """What the environments of a multi-turn rollout reported, per row and in all."""

  status: np.ndarray           # int [B], index into rljax.envs.STATUSES
  tool_calls: np.ndarray       # int [B]
  episodes: list               # the host record of each row (`episodic.Episode`)
  metrics: dict                # turns/*, tools/*, termination/*, tokens/*, env/seconds

  def loss_rows(self, on_truncated) -> tuple[np.ndarray, np.ndarray]:
    """(keep-loss [B], valid [B]) floats from the statuses and `algo.on_truncated_episode`
    ((status, keep | mask | drop) pairs): "mask" rows carry no loss but stay in their
    group's baseline; "drop" rows are not in the baseline either."""
    b = len(self.status)
    keep, valid = np.ones(b, np.float32), np.ones(b, np.float32)
    what_of = dict(on_truncated)
    for code, name in enumerate(STATUSES):
      what = what_of.get(name, "keep")
      rows_of = np.asarray(self.status) == code
      if what in ("mask", "drop"):
        keep[rows_of] = 0.0
      if what == "drop":
        valid[rows_of] = 0.0
    return keep, valid


@dataclasses.dataclass
class RolloutBatch:
  """B = prompts × n completions, group-major (row i is sample i % n of prompt i // n).

  Sequence fields are [B, P] (prompt) or [B, T] (completion) device arrays; `truncated`
  is [B]. Row fields are NumPy [B]; `extent` is the completion's extent in columns
  (sampled and observation tokens: `lengths` for single-turn rows). `components` holds the
  reward's unweighted components by name (the verifier's `accuracy` and `format` among
  them); `greedy_scores` the score of each prompt's greedy completion, repeated n times
  (ReMax); `episodes` what the environments reported (multi-turn); `seconds` the time
  spent generating and scoring.
  """

  prompts: list
  prompt_tokens: Any
  prompt_mask: Any
  tokens: Any
  mask: Any
  sampler_logp: Any
  truncated: Any
  scores: np.ndarray
  accuracy: np.ndarray
  format: np.ndarray
  reward_failed: np.ndarray
  lengths: np.ndarray
  prompt_lengths: np.ndarray
  extent: np.ndarray
  group_id: np.ndarray
  components: dict
  greedy_scores: np.ndarray | None = None
  episodes: EpisodeRecords | None = None
  seconds: dict = dataclasses.field(default_factory=dict)   # generate_s, score_s
  # int [B]: the policy version that sampled each row ([B, T], each token: partial rollouts)
  versions: np.ndarray | None = None
  # MoE policies: the sampler's experts of every token, [B, P + T, L_moe, k] compact ids
  # (`rljax.sampling.Rollout.routes`; routing replay and the flip rate read them); None if dense
  routes: Any = None

  @property
  def size(self) -> int:
    return len(self.scores)

  def tool_use(self):
    """bool [B]: the episode called a tool (None for single-turn rows)."""
    return None if self.episodes is None else self.episodes.tool_calls > 0

  def loss_rows(self, on_truncated=()) -> tuple[np.ndarray, np.ndarray]:
    """(keep-loss [B], valid [B]): ones for single-turn rows; for episodes, from their
    statuses (`EpisodeRecords.loss_rows`)."""
    if self.episodes is None:
      return np.ones(self.size, np.float32), np.ones(self.size, np.float32)
    return self.episodes.loss_rows(on_truncated)

  def sequence_arrays(self) -> dict:
    """The device arrays by name: `SEQUENCE_FIELDS`, and `routes` when recorded."""
    out = {k: getattr(self, k) for k in SEQUENCE_FIELDS}
    if self.routes is not None:
      out["routes"] = self.routes
    return out

  def rows(self) -> dict:
    """Every per-row field as a dict (`components` as `reward/<name>` keys): the form the
    dynamic-sampling buffer selects groups from."""
    out = {**self.sequence_arrays(), **{k: getattr(self, k) for k in ROW_FIELDS}}
    out.update({f"reward/{k}": v for k, v in self.components.items()})
    return out

  @classmethod
  def from_rows(cls, rows: dict, prompts: list) -> RolloutBatch:
    """The inverse of `rows()` (the groups the buffer kept, with their prompts)."""
    components = {k.removeprefix("reward/"): v for k, v in rows.items()
                  if k.startswith("reward/")}
    return cls(prompts=prompts, components=components, routes=rows.get("routes"),
               **{k: rows[k] for k in SEQUENCE_FIELDS + ROW_FIELDS})


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
