"""The slot loop of continuous batching (`rljax.sampling.continuous`): one on-device
`lax.while_loop` that inserts waiting requests into free decode slots or advances every
slot by one token, then drains the last live slots onto fewer and fewer slots.

The decode state is `_Slots` (a KV cache whose generated columns are a ring shared by all
slots); a prompt is prefilled once into `_Prefilled` and copied into the slots of its n
samples.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from rljax.models import KVCache
from rljax.sampling.decode import (
  Decoded,
  decode_forward,
  decode_segments,
  fused_weights,
  is_stop,
  prefill,
  real_routes,
  route_buffer,
)
from rljax.sampling.filters import sample_tokens
from rljax.sampling.streams import stream_uniforms


class _Slots(NamedTuple):
  """Decode state. Cache columns [0, W) hold each slot's prompt; [W, W + T) are a ring
  that every slot writes at the same column, W + clock % T, each decode step (one
  `dynamic_update_slice` for all slots). A slot's j-th generated token sits at ring column
  (birth + j) % T; attention reads the ring through a per-slot mask, and RoPE positions
  are the tokens' own, so the column order does not matter."""
  cache: KVCache          # [S, K, Dh, W + T] keys, [S, K, W + T, Dh] values
  request: jax.Array      # [S] request (row) in the slot, -1 = free
  step: jax.Array         # [S] tokens generated so far by that request
  token: jax.Array        # [S] its last token
  prompt_len: jax.Array   # [S] real prompt tokens
  prompt_mask: jax.Array  # [S, W]
  birth: jax.Array        # [S] clock of the slot request's first decode step
  clock: jax.Array        # decode steps run so far


class _Prefilled(NamedTuple):
  """The KV and last-position logits of the prompt prefilled last (reused for its n samples)."""
  prompt: jax.Array       # scalar prompt index, -1 = none yet
  k: tuple                # per layer [1, K, Dh, W]
  v: tuple                # per layer [1, K, W, Dh]
  logits: jax.Array       # [1, V]
  routes: jax.Array | None = None   # [1, W, L_moe, k] (MoE policies)


def _prefill_row(model, tokens_rw, mask_rw, r, prompt_id, fused):
  """Prefill of row r's prompt into a one-row cache, tagged with its prompt id."""
  tokens = jax.lax.dynamic_index_in_dim(tokens_rw, r, keepdims=True)
  mask = jax.lax.dynamic_index_in_dim(mask_rw, r, keepdims=True)
  positions = jnp.maximum(jnp.cumsum(mask, axis=1) - 1, 0)
  logits, cache, routes = prefill(model, tokens, positions,
                                  model.init_cache(1, tokens.shape[1]), mask, fused)
  return _Prefilled(jnp.asarray(prompt_id, jnp.int32), cache.k, cache.v, logits, routes)


def _write_slot(cache: KVCache, buf: _Prefilled, s):
  """The prompt KV of `buf` into slot `s` (positions [0, W) of that row)."""
  put = lambda c, x: jax.lax.dynamic_update_slice(c, x, (s,) + (0,) * (c.ndim - 1))  # noqa: E731
  return KVCache(tuple(map(put, cache.k, buf.k)), tuple(map(put, cache.v, buf.v)))


def slot_loop(model, tokens_rw, mask_rw, prompt_id_r, streams_r2, num_rows, rng, scalars_3,
              *, spec, slots: int, share_prefill: bool) -> Decoded:
  """Decodes R rows (requests) through `slots` slots; the body of the sampler's program.

  With slots < R, requests wait in a queue and are inserted as slots free. With slots ≥ R
  every request is resident from the start: the static sampler's batched prefill and
  segmented decode run until half the rows have finished, then the drain takes over (to
  the end when fewer than 2 x `MIN_DRAIN_SLOTS` rows leave no drain level).
  Either way, once nothing waits, live slots are compacted onto half as many slots each
  time at most half of them are live (`drain_sizes`: down to `MIN_DRAIN_SLOTS`), so the
  longest requests do not pay for a batch of finished ones.

  Args:
    tokens_rw, mask_rw: int [R, W] the requests' prompts, left-padded (a prompt repeated
      for its n samples).
    prompt_id_r: int [R]; consecutive requests with the same id share one prefill.
    streams_r2: int32 [R, 2], each request's random stream: its draws are the static
      sampler's for that stream (`streams.stream_uniforms`).
    num_rows: the first `num_rows` rows are real (the rest stay empty).
  Returns:
    `Decoded` with R rows.
  """
  requests = tokens_rw.shape[0]
  m = _Machinery(model, tokens_rw, mask_rw, prompt_id_r, streams_r2, num_rows, rng,
                 scalars_3, spec=spec, share_prefill=share_prefill)
  resident = slots >= requests
  sizes = drain_sizes(requests // 2 if resident else slots, queued=not resident)
  # resident: the static decode runs until the first drain level holds the live rows
  carry = m.resident(live_limit=sizes[0] if sizes else 0) if resident else m.queue(slots)
  # resident: nothing waits, so no insert (nor its prefill) in the drain's program
  body = m.decode if resident else m.body
  for i, size in enumerate(sizes):
    if i or resident:
      carry = (_compact(carry[0], size),) + carry[1:]
    carry = jax.lax.while_loop(functools.partial(m.more, size=size, last=size == sizes[-1]),
                               body, carry)
  return carry[3]


class _Machinery:
  """The pieces of the slot loop over one set of requests (see `slot_loop`)."""

  def __init__(self, model, tokens_rw, mask_rw, prompt_id_r, streams_r2, num_rows, rng,
               scalars_3, *, spec, share_prefill):
    self.model, self.tokens_rw, self.mask_rw = model, tokens_rw, mask_rw
    self.prompt_id_r, self.num_rows = prompt_id_r, num_rows
    self.spec, self.share_prefill = spec, share_prefill
    self.requests, self.width = tokens_rw.shape
    self.t_max = spec.max_new_tokens
    self.fused = fused_weights(model)
    self.draw = functools.partial(
        sample_tokens, key=None, temperature=scalars_3[0], greedy=spec.greedy,
        top_k=spec.top_k, top_p=scalars_3[1] if spec.use_top_p else None,
        min_p=scalars_3[2] if spec.use_min_p else None)
    if not spec.greedy:   # the static sampler's draws: step t of request r reads [t, r]
      self.uniform_tr = stream_uniforms(rng, streams_r2, self.t_max)

  def sample(self, logits_sv, step_s, row_s):
    if self.spec.greedy:
      return self.draw(logits_sv, uniform_b=None)
    request_s = jnp.clip(row_s, 0, self.requests - 1)
    return self.draw(logits_sv,
                     uniform_b=self.uniform_tr[jnp.clip(step_s, 0, self.t_max - 1), request_s])

  def record(self, out, row_s, step_s, tok_s, logp_s, logp_full_s, live_s, truncated_s):
    """Writes column step_s of rows row_s where live_s (the others are dropped)."""
    row = jnp.where(live_s, row_s, self.requests)   # out of range: dropped
    put = lambda buf, x: buf.at[row, step_s].set(x.astype(buf.dtype), mode="drop")  # noqa: E731
    return out._replace(tokens=put(out.tokens, tok_s), mask=put(out.mask, jnp.ones_like(tok_s)),
                        logp=put(out.logp, logp_s), logp_full=put(out.logp_full, logp_full_s),
                        truncated=out.truncated.at[row].set(truncated_s, mode="drop"))

  def record_routes(self, out, row_s, step_s, routes_slk, live_s):
    """The routes [S, L_moe, k] of the tokens the slots fed (their column step_s - 1)."""
    if out.routes is None:
      return out
    row = jnp.where(live_s, row_s, self.requests)   # out of range: dropped
    return out._replace(routes=out.routes.at[row, self.width + step_s - 1].set(
        routes_slk, mode="drop"))

  def empty(self, slots):
    """Free slots, no prefilled prompt, empty outputs: the queue loop's start."""
    sl = _Slots(cache=self.model.init_cache(slots, self.width + self.t_max),
                request=jnp.full((slots,), -1, jnp.int32),
                step=jnp.zeros((slots,), jnp.int32), token=jnp.zeros((slots,), jnp.int32),
                prompt_len=jnp.zeros((slots,), jnp.int32),
                prompt_mask=jnp.zeros((slots, self.width), self.mask_rw.dtype),
                birth=jnp.zeros((slots,), jnp.int32), clock=jnp.int32(0))
    buf = jax.eval_shape(lambda: _prefill_row(self.model, self.tokens_rw, self.mask_rw, 0, 0,
                                              self.fused))
    buf = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), buf)._replace(
        prompt=jnp.asarray(-1, jnp.int32))
    r, t = self.requests, self.t_max
    out = Decoded(tokens=jnp.full((r, t), self.spec.pad_id, jnp.int32),
                   mask=jnp.zeros((r, t), jnp.int32), logp=jnp.zeros((r, t), jnp.float32),
                   logp_full=jnp.zeros((r, t), jnp.float32), truncated=jnp.zeros((r,), bool),
                   routes=route_buffer(self.model, r, self.width + t))
    return sl, buf, out

  def queue(self, slots):
    """Requests wait for free slots: fill, decode one step, repeat until none waits."""
    sl, buf, out = self.empty(slots)
    waiting = lambda c: c[2] < self.num_rows  # noqa: E731
    return jax.lax.while_loop(waiting, self.body, (sl, buf, jnp.int32(0), out))

  def resident(self, live_limit: int):
    """Every request in its own row from the start: the static sampler's batched (shared)
    prefill and segmented decode until at most `live_limit` of them are live, as slots."""
    rows = jnp.arange(self.requests)
    step = lambda t, logits: self.sample(logits, jnp.full((self.requests,), t), rows)  # noqa: E731
    group = self.spec.group
    spec = self.spec._replace(group=group if group > 1 and self.requests % group == 0 else 1)
    t, tok, cache, out = decode_segments(self.model, self.tokens_rw, self.mask_rw, step, spec,
                                         live_limit=live_limit)
    real = rows < self.num_rows
    _, _, empty = self.empty(1)   # padding rows (beyond num_rows) stay empty
    out = jax.tree.map(lambda x, e: jnp.where(real.reshape((-1,) + (1,) * (x.ndim - 1)), x, e),
                       out, empty)
    # token j of row r sits at column W + j: the ring layout with birth 0, clock t - 1
    sl = _Slots(cache=cache.grow(self.width + self.t_max),
                request=jnp.where(out.truncated, rows, -1).astype(jnp.int32),
                step=jnp.full((self.requests,), t, jnp.int32), token=tok,
                prompt_len=jnp.sum(self.mask_rw, axis=-1).astype(jnp.int32),
                prompt_mask=self.mask_rw, birth=jnp.zeros((self.requests,), jnp.int32),
                clock=t - 1)
    _, buf, _ = self.empty(1)
    return sl, buf, jnp.asarray(self.num_rows, jnp.int32), out

  def insert(self, carry):
    sl, buf, next_row, out = carry
    s = jnp.argmax(sl.request < 0)
    r = next_row
    pid = self.prompt_id_r[r]
    prefill_now = lambda: _prefill_row(self.model, self.tokens_rw, self.mask_rw, r, pid,  # noqa: E731
                                   self.fused)
    buf = jax.lax.cond(buf.prompt == pid, lambda: buf, prefill_now) if self.share_prefill \
        else prefill_now()
    tok, logp, logp_full = self.sample(buf.logits, jnp.zeros((1,), jnp.int32), r[None])
    stop = is_stop(tok, self.spec.stop_tokens)
    alive = ~stop & (self.t_max > 1)
    out = self.record(out, r[None], jnp.zeros((1,), jnp.int32), tok, logp, logp_full,
                      jnp.ones((1,), bool), ~stop)
    mask_w = jax.lax.dynamic_index_in_dim(self.mask_rw, r, keepdims=False)
    if out.routes is not None:   # the prompt's routes
      out = out._replace(routes=jax.lax.dynamic_update_slice(
          out.routes, real_routes(buf.routes, mask_w[None]), (r, 0, 0, 0)))
    sl = _Slots(cache=_write_slot(sl.cache, buf, s),
                request=sl.request.at[s].set(jnp.where(alive[0], r, -1)),
                step=sl.step.at[s].set(1), token=sl.token.at[s].set(tok[0]),
                prompt_len=sl.prompt_len.at[s].set(jnp.sum(mask_w)),
                prompt_mask=sl.prompt_mask.at[s].set(mask_w),
                birth=sl.birth.at[s].set(sl.clock), clock=sl.clock)
    return sl, buf, next_row + 1, out

  def decode(self, carry):
    sl, buf, next_row, out = carry
    t_max = self.t_max
    live = sl.request >= 0
    # ring column i holds the slot's token (i - birth) % T: valid while that is < step
    ring = jnp.mod(jnp.arange(t_max)[None, :] - sl.birth[:, None], t_max) < sl.step[:, None]
    kv_mask = jnp.concatenate([sl.prompt_mask, ring.astype(sl.prompt_mask.dtype)], axis=1)
    logits, cache, routes = decode_forward(
        self.model, sl.token[:, None], positions=(sl.prompt_len + sl.step - 1)[:, None],
        cache=sl.cache, start=self.width + jnp.mod(sl.clock, t_max), kv_mask=kv_mask,
        causal=False, **self.fused)
    tok, logp, logp_full = self.sample(logits, sl.step, sl.request)
    stop = is_stop(tok, self.spec.stop_tokens)
    out = self.record(out, sl.request, sl.step, tok, logp, logp_full, live, ~stop)
    out = self.record_routes(out, sl.request, sl.step, routes, live)
    finished = stop | (sl.step + 1 >= t_max)
    sl = sl._replace(cache=cache, request=jnp.where(live & finished, -1, sl.request),
                     step=jnp.where(live, sl.step + 1, sl.step),
                     token=jnp.where(live, tok, sl.token), clock=sl.clock + 1)
    return sl, buf, next_row, out

  def can_insert(self, carry):
    sl, _, next_row, _ = carry
    return jnp.any(sl.request < 0) & (next_row < self.num_rows)

  def body(self, carry):
    """Fill every free slot, then one decode step for all slots."""
    return self.decode(jax.lax.while_loop(self.can_insert, self.insert, carry))

  def more(self, carry, *, size, last):
    """Keep decoding at this many slots while requests wait or more than half are live
    (at the last size: while any is)."""
    sl, _, next_row, _ = carry
    live = jnp.sum(sl.request >= 0)
    return (next_row < self.num_rows) | (live > (0 if last else size // 2))


# Slot counts the drain phase steps through (slots, slots/2, ...): each is another copy of
# the decode step in the program, hence the cap.
DRAIN_LEVELS = 4
# No drain level below this many slots: a decode step streams every weight whatever its
# rows, so halving 4 -> 2 -> 1 saves only those rows' matmuls (nothing on an accelerator,
# where a step of a few rows is bandwidth-bound; on a 2-core CPU, a call whose rows stop
# apart at Qwen2.5-0.5B x 8 rows: +3.9 % paired over 3 rounds, 95 % CI -2.5 to +10.3 %,
# benchmarks/decode_segments.py --compare drain),
# while each level is another decode-step program (~50 MB resident, ~2.5 s of compilation).
MIN_DRAIN_SLOTS = 4


def drain_sizes(size: int, *, queued: bool) -> list[int]:
  """The slot counts of the loops after the resident phase: `size` (the queue's slots when
  requests wait, else the first drain level), then halvings; at most `DRAIN_LEVELS` loops,
  and no drain level below `MIN_DRAIN_SLOTS` slots (the queue's own loop always runs)."""
  sizes = [size] if size >= (1 if queued else MIN_DRAIN_SLOTS) else []
  while sizes and len(sizes) < DRAIN_LEVELS and sizes[-1] // 2 >= MIN_DRAIN_SLOTS:
    sizes.append(sizes[-1] // 2)
  return sizes


def _compact(sl: _Slots, size: int) -> _Slots:
  """The first `size` slots after moving the live ones to the front (stable)."""
  order = jnp.argsort(sl.request < 0, stable=True)[:size]
  take = lambda x: jnp.take(x, order, axis=0)  # noqa: E731
  return _Slots(cache=jax.tree.map(take, sl.cache), request=take(sl.request),
                step=take(sl.step), token=take(sl.token), prompt_len=take(sl.prompt_len),
                prompt_mask=take(sl.prompt_mask), birth=take(sl.birth), clock=sl.clock)
