"""Multi-turn rollouts: each row is an episode with an environment (`task.env`).

`rljax.sampling.multiturn` keeps each row's KV cache across turns on the device; this
module drives it. Per row (the factory called with the prompt): reset -> [decode a turn
-> env.step(action) -> observation ids appended] ... until the episode ends. The episode's
score is the task's reward on the transcript (the completion with the observations in it)
plus the sum of the environment's step rewards (`reward/env`).
"""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from rljax.envs.chat import ChatSeam
from rljax.parallel import batch_sharding
from rljax.sampling.multiturn import (
    END_LENGTH,
    END_STOP,
    FINISHED,
    GENERATING,
    WAITING,
    TurnSampler,
    TurnSpec,
)
from rljax.train.config.specs import EpisodeSpec
from rljax.train.rollout.batch import EpisodeRecords, RolloutBatch
from rljax.train.rollout.context import (
    RolloutContext,
    batch_shards,
    encode_prompts,
    row_streams,
    score_texts,
)
from rljax.train.rollout.environments import (
    STATUS_CODE,
    EnvRunner,
    Episode,
    as_step,
    ids_bucket,
    observation_ids,
)
from rljax.train.rollout.environments import episode_metrics as environment_metrics


class _EpisodeLoop:
  """The host loop of one multi-turn rollout over B rows (prompts already repeated n times)."""

  def __init__(self, ctx: RolloutContext, prompts, factory, spec: TurnSpec,
               episode: EpisodeSpec, streams=None):
    self.ctx, self.prompts, self.factory, self.spec = ctx, prompts, factory, spec
    self.streams = (np.stack([np.arange(len(prompts)), np.zeros(len(prompts))], 1)
                    .astype(np.int32) if streams is None else streams)
    self.max_turns, self.max_obs = episode.max_turns, episode.max_observation_tokens
    self.runner = EnvRunner(episode.env_timeout)
    self.seam = None
    if ctx.chat_template:   # observations as chat messages
      self.seam = ChatSeam(ctx.tokenizer)
    self.episodes = [Episode() for _ in prompts]

  def reset(self):
    """Creates and resets every row's environment; returns the first observation's ids."""
    ids_list = []
    for ep, p in zip(self.episodes, self.prompts):
      env, status, message = self.runner.contain(self.factory, p)
      first = ""
      if not status:
        ep.env = env
        first, status, message = self.runner.contain(env.reset, p)
      if status:
        ep.fail(status, message, p.id)
      ids = self.ctx.tokenizer.encode(first or "")[:self.max_obs]
      ids_list.append(ids[:max(self.spec.total - 1, 0)])
    return ids_list

  def respond(self, i, waiting: bool, action: str, cursor: int):
    """Steps row i's environment with its turn's text; returns (observation ids or None,
    finish the row now)."""
    ep = self.episodes[i]
    ep.turns += 1
    ep.turn_ends.append(cursor)
    step, status, message = self.runner.contain(ep.env.step, action)
    if status:
      ep.fail(status, message, self.prompts[i].id)
      ep.tool_calls += int(waiting)
      ep.tool_failures += int(waiting)
      return None, waiting
    step = as_step(step)
    ep.env_reward += float(step.reward)
    ep.step_rewards.append(float(step.reward))
    if waiting:
      ep.tool_calls += int(step.info.get("tool_call", True))
      ep.tool_failures += int(bool(step.info.get("error", False)))
    if not waiting:   # the model ended the episode itself (EOS)
      ep.status = "done"
      return None, False
    if step.done or ep.turns >= self.max_turns:
      ep.status = "done" if step.done else "max_turns"
      return None, True
    room = self.spec.total - cursor - 1   # leave at least one token to sample
    ids = observation_ids(self.ctx.tokenizer, self.seam, step.observation or "", self.max_obs)
    if self.seam is None:
      ids = ids[:max(room, 0)]
    if room <= 0 or len(ids) > room:   # (a chat seam is never cut mid-header)
      ep.status = "length"
      return None, True
    return ids, False

  def round(self, st):
    """Answers every row that waits for its environment or has just ended; returns
    (observation ids per row, resume [B], finish [B], rows still generating)."""
    phase, end, cursor, turn_start, tokens = (np.asarray(x) for x in (
        st.phase, st.end, st.cursor, st.turn_start, st.tokens))
    b = len(self.prompts)
    waiting = phase == WAITING
    obs_ids, resume, finish = [[] for _ in range(b)], np.zeros(b, bool), np.zeros(b, bool)
    for i in np.flatnonzero(waiting | ((phase == FINISHED) & (end == END_STOP))):
      if self.episodes[i].status:   # already ended (reset failure, or an earlier round)
        finish[i] = waiting[i]
        continue
      action = self.ctx.tokenizer.decode(tokens[i, turn_start[i]:cursor[i]].tolist())
      ids, finish[i] = self.respond(i, bool(waiting[i]), action, int(cursor[i]))
      if ids is not None:
        obs_ids[i], resume[i] = ids, True
    for i in np.flatnonzero((phase == FINISHED) & (end == END_LENGTH)):
      self.episodes[i].status = self.episodes[i].status or "length"
    return obs_ids, resume, finish, bool((phase == GENERATING).any())

  def run(self, model, rng):
    """Samples the episodes; returns the final `TurnState` and the prompt ids and mask."""
    spec, b, put = self.spec, len(self.prompts), jnp.asarray
    s = self.ctx.sampling
    reset_bm, reset_len = ids_bucket(self.reset(), self.ctx.tokenizer.pad_id)
    prompt_tokens, prompt_mask = encode_prompts(self.ctx, self.prompts)
    sampler = TurnSampler(model, spec=spec, temperature=s.temperature, top_p=s.top_p,
                          min_p=s.min_p, sampler_dtype=self.ctx.sampler_dtype or None)
    st = sampler.start(put(prompt_tokens), put(prompt_mask), put(reset_bm), put(reset_len), rng,
                       streams=put(self.streams))
    failed_at_reset = np.asarray([bool(e.status) for e in self.episodes])
    if failed_at_reset.any():   # an episode whose environment never started ends at once
      st = sampler.extend(st, put(np.zeros((b, 1), np.int32)), put(np.zeros((b,), np.int32)),
                          put(np.zeros((b,), bool)), put(failed_at_reset), rng)
    while True:
      st = sampler.decode(st, rng)
      obs_ids, resume, finish, generating = self.round(st)
      if not generating and not resume.any():
        break
      if resume.any() or finish.any():
        obs_bm, obs_len = ids_bucket(obs_ids, self.ctx.tokenizer.pad_id)
        st = sampler.extend(st, put(obs_bm), put(obs_len), put(resume), put(finish), rng)
    for ep in self.episodes:
      ep.status = ep.status or "done"
    return st, prompt_tokens, prompt_mask


def run_episodes(ctx: RolloutContext, model, prompts, rng, *, env_factory, spec: TurnSpec,
                 episode: EpisodeSpec, streams=None):
  """Samples one episode per row (prompts already repeated n times).

  Returns:
    (rows, episodes): NumPy rows of the rollout layout (prompt_tokens, prompt_mask [B, P];
    tokens, mask (sampled ids), sampler_logp [B, T]; extent [B] = completion columns incl.
    observations) and the `Episode` record of each row.
  Args:
    streams: int32 [B, 2], each row's random stream (default (row, 0)).
  """
  loop = _EpisodeLoop(ctx, prompts, env_factory, spec, episode, streams)
  st, prompt_tokens, prompt_mask = loop.run(model, rng)
  rows = {"prompt_tokens": prompt_tokens, "prompt_mask": prompt_mask,
          "tokens": np.asarray(st.tokens), "mask": np.asarray(st.mask),
          "sampler_logp": np.asarray(st.logp), "extent": np.asarray(st.cursor, np.int32),
          "env_seconds": loop.runner.seconds}
  return rows, loop.episodes


@dataclasses.dataclass(frozen=True)
class Episodic:
  """Episodes with an environment per row, scored like single-turn rows.

  Attributes:
    factory: `factory(prompt) -> rljax.envs.Env`.
    turn: the static sampling spec (budget, stops) of the run's sampling parameters.
    episode: the run's multi-turn settings.
  """

  ctx: RolloutContext
  factory: object
  turn: TurnSpec
  episode: EpisodeSpec

  def with_context(self, ctx: RolloutContext) -> Episodic:
    return dataclasses.replace(self, ctx=ctx)

  def sample_and_score(self, model, prompts, rng, *, sampling=None) -> RolloutBatch:
    """Episodes for `sampling.n` rows per prompt, scored, with their `EpisodeRecords`."""
    sampling = sampling or self.ctx.sampling
    t0 = time.perf_counter()
    n = sampling.n
    rows = [p for p in prompts for _ in range(n)]
    spec = self.turn._replace(greedy=bool(sampling.greedy), top_k=int(sampling.top_k),
                              use_top_p=sampling.top_p < 1.0, use_min_p=sampling.min_p > 0.0)
    out, episodes = run_episodes(self.ctx.replace(sampling=sampling), model, rows, rng,
                                 env_factory=self.factory, spec=spec, episode=self.episode,
                                 streams=row_streams(prompts, n, len(rows)))
    batch = self._score(rows, episodes, out)
    sharding = (batch_sharding(self.ctx.mesh)
                if self.ctx.mesh is not None and len(rows) % batch_shards(self.ctx.mesh) == 0
                else jax.sharding.SingleDeviceSharding(jax.devices()[0]))
    place = lambda x: jax.device_put(np.asarray(x), sharding)  # noqa: E731
    truncated = np.asarray([e.status == "length" for e in episodes])
    batch = dataclasses.replace(
        batch, prompts=list(prompts), truncated=place(truncated),
        **{k: place(out[k]) for k in ("prompt_tokens", "prompt_mask", "tokens", "mask",
                                      "sampler_logp")},
        prompt_lengths=out["prompt_mask"].sum(axis=1).astype(np.int32),
        group_id=np.repeat(np.arange(len(prompts), dtype=np.int32), n))
    batch.seconds = {"generate_s": time.perf_counter() - t0, "score_s": 0.0}
    return batch

  def _score(self, rows, episodes, out) -> RolloutBatch:
    """The reward on each transcript plus the environment's step rewards."""
    tokens, mask, extent = out["tokens"], out["mask"], out["extent"]
    tok = self.ctx.tokenizer
    decode = ((lambda ids: tok.decode(ids, stop_at_eos=False)) if hasattr(tok, "hf")
              else tok.decode)
    texts = [decode(tokens[i, :extent[i]].tolist()) for i in range(len(rows))]
    total, components, failed = score_texts(self.ctx, rows, texts)
    env_reward = np.asarray([e.env_reward for e in episodes], np.float32)
    scores = env_reward + (0.0 if self.episode.env_reward_only else total)
    records = EpisodeRecords(
        status=np.asarray([STATUS_CODE[e.status] for e in episodes], np.int32),
        tool_calls=np.asarray([e.tool_calls for e in episodes], np.int32), episodes=episodes,
        metrics=environment_metrics(episodes, float(np.sum(mask)), float(np.sum(extent)),
                                out["env_seconds"]))
    return RolloutBatch(
        prompts=[], prompt_tokens=None, prompt_mask=None, tokens=None, mask=None,
        sampler_logp=None, truncated=None, scores=scores.astype(np.float32),
        accuracy=components["accuracy"], format=components["format"], reward_failed=failed,
        lengths=mask.sum(axis=1).astype(np.int32), prompt_lengths=None,
        extent=extent.astype(np.int32), group_id=None,
        components={"env": env_reward, **components}, episodes=records)


