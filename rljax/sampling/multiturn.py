"""Multi-turn rollouts with environments, the KV cache continued across turns.

Every peer re-sends the whole context to its sampler at each turn (verl, TRL, Tunix,
SkyRL, rLLM) and relies on prefix caching; re-tokenising
the text history is their most reported bug (sampler and trainer see different ids). Here
a row's cache lives across the episode: when a turn ends, the environment's observation is
tokenised once and its ids are *extend-prefilled* into the same row (with the turn's last
sampled token, whose KV was still pending), and decoding continues. The trainer's row is
`prompt | sampled ids | observation ids | sampled ids | ...`, exactly the ids the sampler
fed, with `mask` 1 on sampled ids only and `logp` 0 elsewhere: token-in-token-out by
construction.

One episode per row. A row's completion region holds at most `total` tokens (sampled and
observation tokens alike); a turn may use whatever remains. Between compiled decode
loops the host calls the environments of the rows that ended a turn; a decode loop hands
back control as soon as at least as many rows wait for their environment as still
generate, so neither waiting nor finished rows hold the others back for long.

Randomness: the k-th sampled token of row r reads draw k of the row's stream
(`streams.stream_uniforms_at`), so a row's draws do not depend on how the turns of other
rows were scheduled, and match the static sampler's for the same stream.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rljax.models import KVCache
from rljax.sampling import buckets
from rljax.sampling.decode import is_stop
from rljax.sampling.filters import sample_tokens
from rljax.sampling.prepare import split_for_sampling
from rljax.sampling.streams import default_streams, stream_uniforms_at

GENERATING, WAITING, FINISHED = 0, 1, 2
# why a row stopped generating: its episode-ending stop token (EOS), a turn stop (a tool
# call: the environment answers), or the token budget
END_NONE, END_STOP, END_TURN, END_LENGTH = 0, 1, 2, 3


class TurnSpec(NamedTuple):
  """Static sampling configuration of a multi-turn rollout."""

  total: int                               # completion tokens per row (sampled + observations)
  stop_tokens: tuple[int, ...]             # end the episode (EOS)
  turn_stops: tuple[tuple[int, ...], ...]  # token sequences that end a turn
  greedy: bool
  top_k: int
  use_top_p: bool
  use_min_p: bool
  pad_id: int
  # cache columns after the completion region: an extend writes a padded chunk of up to
  # `scratch` tokens from a row's pending token on, and rows that are not extended write
  # theirs here (dynamic_update_slice would otherwise clamp and shift the write)
  scratch: int = 1


class TurnState(NamedTuple):
  """Per-row rollout state (device arrays)."""

  cache: KVCache        # [B, K, Dh, W + T + scratch]; completion j at column W + j
  prompt_mask: jax.Array  # [B, W]
  prompt_len: jax.Array   # [B]
  cursor: jax.Array       # [B] completion tokens written (sampled + observation)
  sampled: jax.Array      # [B] tokens sampled so far (the index of the next draw)
  turn_start: jax.Array   # [B] completion index of the current turn's first sampled token
  phase: jax.Array        # [B] GENERATING | WAITING | FINISHED
  end: jax.Array          # [B] END_* of the last stop
  tokens: jax.Array       # [B, T] completion ids (sampled and observation)
  mask: jax.Array         # [B, T] 1 on sampled ids
  logp: jax.Array         # [B, T] sampler log-prob of sampled ids, 0 elsewhere
  logp_full: jax.Array    # [B, T]
  streams: jax.Array      # [B, 2] each row's random stream (streams.stream_uniforms)


def _draw(spec, scalars_3, rng, streams_b2, logits_bv, k_b):
  """Sample one token per row with draw index k_b (the row's sampled-token count)."""
  draw = functools.partial(
      sample_tokens, key=None, temperature=scalars_3[0], greedy=spec.greedy, top_k=spec.top_k,
      top_p=scalars_3[1] if spec.use_top_p else None,
      min_p=scalars_3[2] if spec.use_min_p else None)
  if spec.greedy:
    return draw(logits_bv, uniform_b=None)
  # row b's k-th draw of its stream, as the static sampler's row with that stream
  return draw(logits_bv, uniform_b=stream_uniforms_at(rng, streams_b2, k_b))


def _ends_turn(tokens_bt, cursor_b, turn_start_b, turn_stops):
  """Whether the last written tokens of each row complete one of the turn-stop sequences
  (inside the current turn)."""
  out = jnp.zeros(cursor_b.shape, bool)
  for seq in turn_stops:
    n = len(seq)
    start = jnp.maximum(cursor_b - n, 0)
    tail = jax.vmap(lambda row, s, n=n: jax.lax.dynamic_slice(row, (s,), (n,)))(tokens_bt, start)
    hit = jnp.all(tail == jnp.asarray(seq, tokens_bt.dtype)[None], axis=1)
    out = out | (hit & (cursor_b - n >= turn_start_b))
  return out


def _accept(spec, st: TurnState, tok, logp, logp_full, rows):
  """Writes the sampled token of `rows` at their cursor and updates phase / end."""
  t_max = spec.total
  col = jnp.where(rows, st.cursor, t_max)   # out of range: dropped
  put = lambda buf, x: buf.at[jnp.arange(buf.shape[0]), col].set(  # noqa: E731
      x.astype(buf.dtype), mode="drop")
  tokens = put(st.tokens, tok)
  st = st._replace(tokens=tokens, mask=put(st.mask, jnp.ones_like(tok)),
                   logp=put(st.logp, logp), logp_full=put(st.logp_full, logp_full),
                   cursor=jnp.where(rows, st.cursor + 1, st.cursor),
                   sampled=jnp.where(rows, st.sampled + 1, st.sampled))
  stop = is_stop(tok, spec.stop_tokens)
  turn = _ends_turn(tokens, st.cursor, st.turn_start, spec.turn_stops) & ~stop
  full = st.cursor >= t_max
  # a stop token ends the episode; a full budget too, even right after a turn stop
  end = jnp.where(stop, END_STOP, jnp.where(full, END_LENGTH, jnp.where(turn, END_TURN,
                                                                        END_NONE)))
  phase = jnp.where(stop | full, FINISHED, jnp.where(turn, WAITING, GENERATING))
  return st._replace(phase=jnp.where(rows, phase, st.phase), end=jnp.where(rows, end, st.end))


def _start(graphdef, state, tokens_bw, mask_bw, reset_bm, reset_len_b, streams_b2, rng,
           scalars_3, *,
           spec: TurnSpec):
  """Prefill prompt + reset observation (completion columns [0, m0)), first draw."""
  buckets._note_trace()
  model = nnx.merge(graphdef, state)
  b, w = tokens_bw.shape
  m0 = reset_bm.shape[1]
  fused = {"fused": model.fused_weights()} if hasattr(model, "fused_weights") else {}
  cache = model.init_cache(b, w + spec.total + spec.scratch)
  prompt_len = jnp.sum(mask_bw, axis=1).astype(jnp.int32)
  obs_valid = (jnp.arange(m0)[None] < reset_len_b[:, None]).astype(mask_bw.dtype)
  seq = jnp.concatenate([tokens_bw, reset_bm], axis=1)
  seq_mask = jnp.concatenate([mask_bw, obs_valid], axis=1)
  positions = jnp.maximum(jnp.cumsum(seq_mask, axis=1) - 1, 0)
  kv_mask = jnp.concatenate(
      [seq_mask, jnp.zeros((b, spec.total + spec.scratch - m0), mask_bw.dtype)], axis=1)
  hidden, cache = model.hidden_cached(seq, positions=positions, cache=cache, start=0,
                                      kv_mask=kv_mask, **fused)
  last = w - 1 + reset_len_b
  logits = model.logits_from_hidden(jnp.take_along_axis(hidden, last[:, None, None], 1)[:, 0])
  t = spec.total
  obs_cols = jnp.arange(t)[None] < reset_len_b[:, None]
  tokens = jnp.where(obs_cols, jnp.pad(reset_bm, ((0, 0), (0, t - m0)),
                                       constant_values=spec.pad_id), spec.pad_id)
  st = TurnState(cache=cache, prompt_mask=mask_bw, prompt_len=prompt_len,
                 cursor=reset_len_b.astype(jnp.int32), sampled=jnp.zeros((b,), jnp.int32),
                 turn_start=reset_len_b.astype(jnp.int32), phase=jnp.zeros((b,), jnp.int32),
                 end=jnp.zeros((b,), jnp.int32), tokens=tokens.astype(jnp.int32),
                 mask=jnp.zeros((b, t), jnp.int32), logp=jnp.zeros((b, t), jnp.float32),
                 logp_full=jnp.zeros((b, t), jnp.float32), streams=streams_b2)
  tok, logp, logp_full = _draw(spec, scalars_3, rng, st.streams, logits, st.sampled)
  return _accept(spec, st, tok, logp, logp_full, jnp.ones((b,), bool))


def _decode(graphdef, state, st: TurnState, rng, scalars_3, *, spec: TurnSpec):
  """Decodes the generating rows until none generates, or at least as many wait for their
  environment as generate."""
  buckets._note_trace()
  model = nnx.merge(graphdef, state)
  b, w = st.prompt_mask.shape
  fused = {"fused": model.fused_weights()} if hasattr(model, "fused_weights") else {}

  def cond(st):
    gen = jnp.sum(st.phase == GENERATING)
    wait = jnp.sum(st.phase == WAITING)
    return (gen > 0) & ~((wait > 0) & (wait >= gen))

  def body(st):
    live = st.phase == GENERATING
    last = jnp.maximum(st.cursor - 1, 0)
    token = jnp.take_along_axis(st.tokens, last[:, None], 1)   # the pending token
    kv_mask = jnp.concatenate(
        [st.prompt_mask, (jnp.arange(spec.total + spec.scratch)[None] < st.cursor[:, None])
         .astype(st.prompt_mask.dtype)], axis=1)
    logits, cache = model.forward_cached(
        token, positions=(st.prompt_len + last)[:, None], cache=st.cache, start=w + last,
        kv_mask=kv_mask, **fused)
    tok, logp, logp_full = _draw(spec, scalars_3, rng, st.streams, logits[:, 0], st.sampled)
    return _accept(spec, st._replace(cache=cache), tok, logp, logp_full, live)

  return jax.lax.while_loop(cond, body, st)


def _extend(graphdef, state, st: TurnState, obs_bm, obs_len_b, resume_b, finish_b, rng,
            scalars_3, *, spec: TurnSpec):
  """Continues the `resume_b` rows: appends each one's observation ids (after the turn's
  last sampled token, whose KV is still pending) to its cache in one forward, and draws the
  next turn's first token. `finish_b` rows end their episode; the others are untouched.

  Rows not resumed write into the scratch columns after the completion region, which
  no row ever attends.
  """
  buckets._note_trace()
  model = nnx.merge(graphdef, state)
  b, w = st.prompt_mask.shape
  m = obs_bm.shape[1]
  fused = {"fused": model.fused_weights()} if hasattr(model, "fused_weights") else {}
  last = jnp.maximum(st.cursor - 1, 0)
  pending = jnp.take_along_axis(st.tokens, last[:, None], 1)
  chunk = jnp.concatenate([pending, obs_bm], axis=1)   # [B, 1 + M]
  new_end = st.cursor + obs_len_b        # completion tokens after the observation
  if m + 1 > spec.scratch:
    raise ValueError(f"an observation chunk of {m + 1} tokens exceeds the cache's scratch "
                     f"columns ({spec.scratch})")
  kv_mask = jnp.concatenate(
      [st.prompt_mask, (jnp.arange(spec.total + spec.scratch)[None] < new_end[:, None])
       .astype(st.prompt_mask.dtype)], axis=1)
  positions = st.prompt_len[:, None] + last[:, None] + jnp.arange(m + 1)[None]
  # rows that are not extended write their (unused) chunk into the scratch columns
  start = jnp.where(resume_b, w + last, w + spec.total)
  hidden, cache = model.hidden_cached(chunk, positions=positions, cache=st.cache,
                                      start=start, kv_mask=kv_mask, **fused)
  logits = model.logits_from_hidden(
      jnp.take_along_axis(hidden, obs_len_b[:, None, None], 1)[:, 0])
  # the observation ids into the completion, mask 0
  offset = jnp.arange(spec.total)[None] - st.cursor[:, None]
  inside = resume_b[:, None] & (offset >= 0) & (offset < obs_len_b[:, None])
  tokens = jnp.where(inside, jnp.take_along_axis(obs_bm, jnp.clip(offset, 0, m - 1), 1),
                     st.tokens)
  cursor = jnp.where(resume_b, new_end, st.cursor)
  st = st._replace(cache=cache, tokens=tokens, cursor=cursor,
                   turn_start=jnp.where(resume_b, cursor, st.turn_start),
                   phase=jnp.where(finish_b, FINISHED, st.phase))
  tok, logp, logp_full = _draw(spec, scalars_3, rng, st.streams, logits, st.sampled)
  return _accept(spec, st, tok, logp, logp_full, resume_b)


_start_jit = jax.jit(_start, static_argnums=(0,), static_argnames=("spec",))
_decode_jit = jax.jit(_decode, static_argnums=(0,), static_argnames=("spec",), donate_argnums=(2,))
_extend_jit = jax.jit(_extend, static_argnums=(0,), static_argnames=("spec",),
                      donate_argnums=(2,))


class TurnSampler:
  """The device side of a multi-turn rollout: start, decode a turn, extend with
  observations. The host loop (`rljax.train.rollout.episodic`) drives it."""

  def __init__(self, model, *, spec: TurnSpec, temperature=1.0, top_p=1.0, min_p=0.0,
               sampler_dtype=None):
    self.graphdef, self.state, _ = split_for_sampling(model, sampler_dtype)
    self.spec = spec
    self.scalars = jnp.asarray(np.asarray([temperature if temperature > 0 else 1.0, top_p,
                                           min_p], np.float32))

  def start(self, tokens_bw, mask_bw, reset_bm, reset_len_b, rng, streams=None):
    """The episodes' first turn up to their first draw; `streams` int32 [B, 2] (default
    (row, 0): each row its own prompt)."""
    streams = default_streams(tokens_bw.shape[0]) if streams is None else jnp.asarray(streams)
    return _start_jit(self.graphdef, self.state, tokens_bw, mask_bw, reset_bm, reset_len_b,
                      streams, rng, self.scalars, spec=self.spec)

  def decode(self, st, rng):
    return _decode_jit(self.graphdef, self.state, st, rng, self.scalars, spec=self.spec)

  def extend(self, st, obs_bm, obs_len_b, resume_b, finish_b, rng):
    return _extend_jit(self.graphdef, self.state, st, obs_bm, obs_len_b, resume_b, finish_b,
                       rng, self.scalars, spec=self.spec)
