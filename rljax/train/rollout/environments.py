"""The host side of environments in a multi-turn rollout: episode records, calls with a
deadline, failures contained as statuses, observation ids, the static turn spec.

Environment exceptions and timeouts are contained like reward failures: the episode ends
with status `env_error` / `env_timeout`, is counted and logged with its prompt id, and the
run goes on.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import time

import numpy as np

from rljax.envs import STATUSES, Step
from rljax.sampling import buckets
from rljax.sampling.multiturn import TurnSpec

STATUS_CODE = {name: i for i, name in enumerate(STATUSES)}


@dataclasses.dataclass
class Episode:
  """Host-side record of one row's episode."""

  env: object = None
  status: str = ""
  turns: int = 0
  tool_calls: int = 0
  tool_failures: int = 0
  env_reward: float = 0.0
  step_rewards: list = dataclasses.field(default_factory=list)
  turn_ends: list = dataclasses.field(default_factory=list)   # completion index after each turn
  error: str = ""

  def fail(self, status: str, message: str, prompt_id) -> None:
    self.status, self.error = status, message
    print(f"[rljax] environment failed on prompt {prompt_id}: {status}: {message}")


class EnvRunner:
  """Calls environment methods with a deadline on a worker thread (a hung environment is
  abandoned, as hung reward functions are in `rljax.rewards.base`)."""

  def __init__(self, timeout: float | None):
    self.timeout = timeout
    self._pool = None
    self.seconds = 0.0

  def __call__(self, fn, *args):
    t0 = time.perf_counter()
    try:
      if self.timeout is None:
        return fn(*args)
      if self._pool is None:
        self._pool = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="env")
      future = self._pool.submit(fn, *args)
      try:
        return future.result(timeout=self.timeout)
      except cf.TimeoutError:
        self._pool.shutdown(wait=False)
        self._pool = None
        raise
    finally:
      self.seconds += time.perf_counter() - t0

  def contain(self, fn, *args):
    """(result, status or "", message): env_timeout / env_error instead of raising."""
    try:
      return self(fn, *args), "", ""
    except cf.TimeoutError:
      return None, "env_timeout", f"no result within {self.timeout} s"
    except Exception as e:  # noqa: BLE001 (contained, counted, reported)
      return None, "env_error", f"{type(e).__name__}: {e}"[:300]


def as_step(step) -> Step:
  """An environment's answer as a `Step` (a dict of its fields, or any text)."""
  if isinstance(step, Step):
    return step
  return Step(**step) if isinstance(step, dict) else Step(observation=str(step))


def turn_spec(tokenizer, sampling, turn_stop_strings, max_observation_tokens=64) -> TurnSpec:
  """The static multi-turn sampling configuration: total budget, EOS, turn-stop id sequences.

  A turn stop that is the tokenizer's EOS (a chat model ends every turn with it) ends the
  turn, not the episode: the environment then decides.
  """
  stops = tuple(tuple(tokenizer.encode(s)) for s in turn_stop_strings)
  if any(not s for s in stops):
    raise ValueError(f"sampling.turn_stop={list(turn_stop_strings)!r}: a string encodes to no "
                     "tokens")
  single = {s[0] for s in stops if len(s) == 1}
  return TurnSpec(total=int(sampling.max_new_tokens),
                  stop_tokens=tuple(t for t in sampling.stop_tokens if t not in single),
                  turn_stops=stops, greedy=bool(sampling.greedy), top_k=int(sampling.top_k),
                  use_top_p=sampling.top_p < 1.0, use_min_p=sampling.min_p > 0.0,
                  pad_id=int(tokenizer.pad_id),
                  scratch=buckets.round_up(max(max_observation_tokens, 1), "pow2") + 1)


def ids_bucket(ids_list, pad_id):
  """Right-padded [B, M] ids (M a power of two >= 1) and their lengths."""
  width = buckets.round_up(max([len(x) for x in ids_list] + [1]), "pow2")
  out = np.full((len(ids_list), width), pad_id, np.int32)
  for i, ids in enumerate(ids_list):
    out[i, :len(ids)] = ids
  return out, np.asarray([len(x) for x in ids_list], np.int32)


def observation_ids(tokenizer, seam, text, max_tokens):
  """Ids of an observation: its text cut to `max_tokens` tokens, then wrapped by the chat
  seam (`rljax.envs.chat.ChatSeam`: end-of-turn, role header, next assistant header) when
  the run uses a chat template; the seam's own ids are not counted in `max_tokens`."""
  ids = tokenizer.encode(text)
  if seam is None:
    return ids[:max_tokens]
  if len(ids) > max_tokens:
    text = tokenizer.decode(ids[:max_tokens], stop_at_eos=False, skip_special=False)
  return seam.observation_ids(text)


def episode_metrics(episodes, sampled_tokens: float, extent_tokens: float,
                    env_seconds: float) -> dict:
  """turns/*, tools/*, termination/<status> fractions, token counts, environment time."""
  n = max(len(episodes), 1)
  calls = sum(e.tool_calls for e in episodes)
  out = {"turns/mean": float(np.mean([e.turns for e in episodes])),
         "turns/max": float(max(e.turns for e in episodes)),
         "tools/calls_per_episode": calls / n,
         "tools/failure_rate": (sum(e.tool_failures for e in episodes) / calls) if calls else 0.0,
         "tokens/sampled_per_episode": sampled_tokens / n,
         "tokens/observation_per_episode": (extent_tokens - sampled_tokens) / n,
         "env/seconds": float(env_seconds)}
  for status in STATUSES:
    out[f"termination/{status}"] = sum(e.status == status for e in episodes) / n
  return out
