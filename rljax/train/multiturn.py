"""The host side of a multi-turn rollout: environments, observations, statuses, metrics.

`rljax.sampling.multiturn` keeps each row's KV cache across turns on the device; this
module drives it. Per row (one episode, `task.env`'s factory called with the prompt):
reset -> [decode a turn -> env.step(action) -> observation ids appended] ... until the
episode ends. Environment exceptions and timeouts are contained like reward failures:
the episode ends with status `env_error` / `env_timeout`, is counted and logged with its
prompt id, and the run goes on.

Episode score = the task's reward on the transcript (`sampling` completion with the
observations in it) + the sum of the environment's step rewards (`reward/env`).
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import math
import time

import jax
import jax.numpy as jnp
import numpy as np

from rljax.envs import STATUSES, Step
from rljax.sampling import buckets
from rljax.sampling.multiturn import (
    END_LENGTH,
    END_STOP,
    FINISHED,
    GENERATING,
    WAITING,
    TurnSampler,
    TurnSpec,
)

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


@dataclasses.dataclass(frozen=True)
class EpisodeConfig:
  """A run's multi-turn settings (`task.env`, `sampling.max_turns`, ...)."""

  factory: object
  spec: TurnSpec
  max_turns: int
  max_observation_tokens: int
  timeout: float | None
  reward_only: bool = False


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


def _ids_bucket(ids_list, pad_id):
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


def _contain(runner, fn, *args):
  """(result, status or "", message): env_timeout / env_error instead of raising."""
  try:
    return runner(fn, *args), "", ""
  except cf.TimeoutError:
    return None, "env_timeout", f"no result within {runner.timeout} s"
  except Exception as e:  # noqa: BLE001 (contained, counted, reported)
    return None, "env_error", f"{type(e).__name__}: {e}"[:300]


def run_episodes(ctx, model, prompts, rng, *, env_factory, spec: TurnSpec, max_turns: int,
                 max_observation_tokens: int, env_timeout: float | None):
  """Samples one episode per prompt row (prompts already repeated n times).

  Returns:
    (rows, episodes): rows of the rollout layout (prompt_tokens, prompt_mask [B, P];
    tokens, mask (sampled ids), sampler_logp [B, T]; truncated [B]; extent [B] = completion
    tokens incl. observations) as NumPy, and the `Episode` of each row.
  """
  tok = ctx.tokenizer
  b = len(prompts)
  runner = EnvRunner(env_timeout)
  seam = None
  if getattr(ctx, "chat_template", False):   # observations as chat messages
    from rljax.envs.chat import ChatSeam
    seam = ChatSeam(tok)
  episodes = [Episode() for _ in range(b)]
  reset_ids = []
  for i, p in enumerate(prompts):
    env, status, message = _contain(runner, env_factory, p)
    first = ""
    if not status:
      episodes[i].env = env
      first, status, message = _contain(runner, env.reset, p)
    if status:
      episodes[i].status, episodes[i].error = status, message
      print(f"[rljax] environment failed on prompt {p.id}: {status}: {message}")
    ids = tok.encode(first or "")[:max_observation_tokens]
    reset_ids.append(ids[:max(spec.total - 1, 0)])
  from rljax.train.rollout import encode_prompts
  prompt_tokens, prompt_mask = encode_prompts(ctx, prompts)
  reset_bm, reset_len = _ids_bucket(reset_ids, tok.pad_id)
  sampler = TurnSampler(model, spec=spec, temperature=ctx.sampling.temperature,
                        top_p=ctx.sampling.top_p, min_p=ctx.sampling.min_p)
  put = lambda x: jnp.asarray(x)  # noqa: E731
  st = sampler.start(put(prompt_tokens), put(prompt_mask), put(reset_bm), put(reset_len), rng)
  failed_at_reset = np.asarray([bool(e.status) for e in episodes])
  if failed_at_reset.any():   # an episode whose environment never started ends at once
    st = sampler.extend(st, put(np.zeros((b, 1), np.int32)), put(np.zeros((b,), np.int32)),
                        put(np.zeros((b,), bool)), put(failed_at_reset), rng)
  while True:
    st = sampler.decode(st, rng)
    phase, end, cursor, turn_start, tokens = (np.asarray(x) for x in (
        st.phase, st.end, st.cursor, st.turn_start, st.tokens))
    waiting = phase == WAITING
    obs_ids = [[] for _ in range(b)]
    resume = np.zeros(b, bool)
    finish = np.zeros(b, bool)
    for i in np.flatnonzero(waiting | ((phase == FINISHED) & (end == END_STOP))):
      ep = episodes[i]
      if ep.status:   # already ended (reset failure, or recorded in an earlier round)
        finish[i] = waiting[i]
        continue
      action = tok.decode(tokens[i, turn_start[i]:cursor[i]].tolist())
      ep.turns += 1
      ep.turn_ends.append(int(cursor[i]))
      step, status, message = _contain(runner, ep.env.step, action)
      tool_call = bool(waiting[i])
      if status:
        ep.status, ep.error = status, message
        print(f"[rljax] environment failed on prompt {prompts[i].id}: {status}: {message}")
        finish[i] = waiting[i]
        ep.tool_calls += int(tool_call)
        ep.tool_failures += int(tool_call)
        continue
      if not isinstance(step, Step):
        step = Step(**step) if isinstance(step, dict) else Step(observation=str(step))
      ep.env_reward += float(step.reward)
      ep.step_rewards.append(float(step.reward))
      if tool_call:
        ep.tool_calls += int(step.info.get("tool_call", True))
        ep.tool_failures += int(bool(step.info.get("error", False)))
      if not waiting[i]:   # the model ended the episode itself (EOS)
        ep.status = "done"
        continue
      if step.done:
        ep.status, finish[i] = "done", True
      elif ep.turns >= max_turns:
        ep.status, finish[i] = "max_turns", True
      else:
        room = spec.total - int(cursor[i]) - 1   # leave at least one token to sample
        ids = observation_ids(tok, seam, step.observation or "", max_observation_tokens)
        if seam is None:
          ids = ids[:max(room, 0)]
        if room <= 0 or len(ids) > room:   # (a chat seam is never cut mid-header)
          ep.status, finish[i] = "length", True
        else:
          obs_ids[i], resume[i] = ids, True
    for i in np.flatnonzero((phase == FINISHED) & (end == END_LENGTH)):
      if not episodes[i].status:
        episodes[i].status = "length"
    if not (phase == GENERATING).any() and not resume.any():
      break
    if not resume.any() and not finish.any():
      continue
    obs_bm, obs_len = _ids_bucket(obs_ids, tok.pad_id)
    st = sampler.extend(st, put(obs_bm), put(obs_len), put(resume), put(finish), rng)
  for ep in episodes:
    ep.status = ep.status or "done"
  rows = {"prompt_tokens": prompt_tokens, "prompt_mask": prompt_mask,
          "tokens": np.asarray(st.tokens), "mask": np.asarray(st.mask),
          "sampler_logp": np.asarray(st.logp),
          "truncated": np.asarray([e.status == "length" for e in episodes]),
          "extent": np.asarray(st.cursor, np.int32), "env_seconds": runner.seconds}
  return rows, episodes


def episode_metrics(episodes, rows) -> dict:
  """turns/*, tools/*, termination/<status> fractions, token counts."""
  n = max(len(episodes), 1)
  calls = sum(e.tool_calls for e in episodes)
  sampled = float(np.sum(rows["mask"]))
  observation = float(np.sum(rows["extent"])) - sampled
  out = {"turns/mean": float(np.mean([e.turns for e in episodes])),
         "turns/max": float(max(e.turns for e in episodes)),
         "tools/calls_per_episode": calls / n,
         "tools/failure_rate": (sum(e.tool_failures for e in episodes) / calls) if calls else 0.0,
         "tokens/sampled_per_episode": sampled / n,
         "tokens/observation_per_episode": observation / n,
         "env/seconds": float(rows.get("env_seconds", 0.0))}
  for status in STATUSES:
    out[f"termination/{status}"] = sum(e.status == status for e in episodes) / n
  return out


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


def to_device_rows(rows, sharding):
  """The sequence arrays as device arrays on the batch sharding."""
  return {k: jax.device_put(np.asarray(v), sharding) if k in (
      "prompt_tokens", "prompt_mask", "tokens", "mask", "sampler_logp", "truncated") else v
      for k, v in rows.items()}


def sample_and_score(ctx, model, prompts, rng, *, sampling):
  """Episodes for `sampling.n` rows per prompt, scored: the rollout rows of
  `rljax.train.rollout.score` (+ `extent`, `status`, `tool_calls`, `reward/env`, and the
  episodes' metrics under `episode_metrics`)."""
  from rljax.parallel import batch_sharding
  from rljax.train.rollout import REWARD_PREFIX

  ep_cfg = ctx.episodes
  n = sampling.n
  rep = [p for p in prompts for _ in range(n)]
  spec = ep_cfg.spec._replace(greedy=bool(sampling.greedy), top_k=int(sampling.top_k),
                              use_top_p=sampling.top_p < 1.0, use_min_p=sampling.min_p > 0.0)
  ctx_s = dataclasses.replace(ctx, sampling=sampling)
  rows, episodes = run_episodes(ctx_s, model, rep, rng, env_factory=ep_cfg.factory, spec=spec,
                                max_turns=ep_cfg.max_turns,
                                max_observation_tokens=ep_cfg.max_observation_tokens,
                                env_timeout=ep_cfg.timeout)
  tok = ctx.tokenizer
  texts = [tok.decode(rows["tokens"][i, :rows["extent"][i]].tolist(), stop_at_eos=False)
           if hasattr(tok, "hf") else tok.decode(rows["tokens"][i, :rows["extent"][i]].tolist())
           for i in range(len(rep))]
  rewards = ctx.reward_fn(rep, texts)
  failed = np.zeros(len(rep), np.int32)
  for failure in rewards.failures:
    failed[failure.index] = 1
    print(f"[rljax] reward {failure.component!r} failed on prompt {failure.prompt_id}: "
          f"{failure.kind}: {failure.message}")
  env_reward = np.asarray([e.env_reward for e in episodes], np.float32)
  scores = env_reward + (0.0 if ep_cfg.reward_only else rewards.total)
  out = {"scores": scores.astype(np.float32), "accuracy": rewards.components["accuracy"],
         "format": rewards.components["format"], "reward_failed": failed,
         "lengths": rows["mask"].sum(axis=1).astype(np.int32),
         "prompt_lengths": rows["prompt_mask"].sum(axis=1).astype(np.int32),
         "extent": rows["extent"],
         "status": np.asarray([STATUS_CODE[e.status] for e in episodes], np.int32),
         "tool_calls": np.asarray([e.tool_calls for e in episodes], np.int32),
         "group_id": np.repeat(np.arange(len(prompts), dtype=np.int32), n),
         f"{REWARD_PREFIX}env": env_reward,
         "episode_metrics": episode_metrics(episodes, rows), "episodes": episodes}
  out.update({f"{REWARD_PREFIX}{k}": v for k, v in rewards.components.items()})
  shards = 1
  if ctx.mesh is not None:
    from rljax.parallel import BATCH_AXES
    shards = math.prod(ctx.mesh.shape[a] for a in BATCH_AXES)
  sharding = (batch_sharding(ctx.mesh) if ctx.mesh is not None and len(rep) % shards == 0
              else jax.sharding.SingleDeviceSharding(jax.devices()[0]))
  for k in ("prompt_tokens", "prompt_mask", "tokens", "mask", "sampler_logp", "truncated"):
    out[k] = jax.device_put(np.asarray(rows[k]), sharding)
  return out


def turn_advantages(episodes, scores, env_rewards, mask, *, group: int, gamma: float,
                    eps: float = 1e-6) -> np.ndarray:
  """Per-token advantages from per-turn rewards (`algo.turn_rewards`).

  Turn k's step reward r_k sits on its last sampled token; the rest of the score (the
  task's verifier) on the last turn. A token of turn k gets the discounted return from
  its turn, G_k = Σ_{j≥k} γ^{j−k} r_j, minus the mean of its group's episode returns G_0,
  over their std (+ε): GRPO's normalisation with the group's episodes as the baseline
  (per-turn-index baselines are biased when the policy decides when to stop: verl RFC
  #7244, `shared/research/agentic.md`).

  Returns:
    float32 [B, T], 0 on non-sampled tokens.
  """
  mask = np.asarray(mask) > 0
  b, t = mask.shape
  returns = np.zeros((b, t), np.float32)
  first = np.zeros(b, np.float32)
  for i, ep in enumerate(episodes):
    rewards = list(ep.step_rewards)[:len(ep.turn_ends)]
    ends = list(ep.turn_ends)
    if not ends or mask[i, ends[-1]:].any():   # a last turn that never reached the env
      ends.append(t)
      rewards.append(0.0)
    rewards[-1] += float(scores[i] - env_rewards[i])   # the verifier's part: the last turn
    g, running = np.zeros(len(rewards), np.float32), 0.0
    for k in reversed(range(len(rewards))):
      running = rewards[k] + gamma * running
      g[k] = running
    start = 0
    for k, end in enumerate(ends):
      returns[i, start:end] = g[k]
      start = end
    first[i] = g[0] if len(g) else 0.0
  g0 = first.reshape(-1, group)
  mean = np.repeat(g0.mean(axis=1), group)
  std = np.repeat(g0.std(axis=1, ddof=1) if group > 1 else np.ones(len(g0)), group)
  return np.where(mask, (returns - mean[:, None]) / (std[:, None] + eps), 0.0).astype(np.float32)
