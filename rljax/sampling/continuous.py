"""Continuous batching: a fixed number of decode slots, refilled as rows finish.

A static batch decodes every row until the longest one stops; with long-tailed lengths
most row-steps are spent on finished rows. Here R requests (B prompts × n samples) share
S < R slots: one compiled `lax.while_loop` either inserts the next waiting request into
a free slot (copying its prompt's KV in, prefilled once per prompt and kept for its n
samples) or advances every slot by one token. No host round trip, one program per shape
bucket. The design follows JetStream's `prefill` / `insert` / `generate` slot API and
tpu-inference's "decode until a slot frees, then refill" loop (`shared/research/rollout.md`
§1.1-1.3), written as one on-device loop.

A request's tokens depend only on its own index r: its step t reads the uniform
`row_uniforms(fold_in(rng, t), R)[r]`, exactly as row r of the static sampler
(`rljax.sampling.sampler`) does, so the same request gives the same tokens and
log-probs whichever slot it ran in, and in either sampler (up to float summation order).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rljax.models import KVCache
from rljax.sampling import buckets
from rljax.sampling.filters import row_uniforms, sample_tokens
from rljax.sampling.params import SamplingParams
from rljax.sampling.rollout import Rollout
from rljax.sampling.sampler import (
    _check_prompts,
    _Decoded,
    _is_stop,
    _prefill,
    _spec_and_scalars,
    _split,
)


class _Slots(NamedTuple):
  cache: KVCache          # [S, K, Dh, W + T] keys, [S, K, W + T, Dh] values
  request: jax.Array      # [S] request index in the slot, -1 = free
  step: jax.Array         # [S] tokens generated so far by that request
  token: jax.Array        # [S] its last token
  prompt_len: jax.Array   # [S] real prompt tokens
  prompt_mask: jax.Array  # [S, W]


class _Prefilled(NamedTuple):
  """The KV and last-position logits of the prompt prefilled last (reused for its n samples)."""
  prompt: jax.Array       # scalar prompt index, -1 = none yet
  k: tuple                # per layer [1, K, Dh, W]
  v: tuple                # per layer [1, K, W, Dh]
  logits: jax.Array       # [1, V]


def _prefill_prompt(model, tokens_bw, mask_bw, i, fused):
  tokens = jax.lax.dynamic_index_in_dim(tokens_bw, i, keepdims=True)
  mask = jax.lax.dynamic_index_in_dim(mask_bw, i, keepdims=True)
  positions = jnp.maximum(jnp.cumsum(mask, axis=1) - 1, 0)
  logits, cache = _prefill(model, tokens, positions, model.init_cache(1, tokens.shape[1]),
                           mask, fused)
  return _Prefilled(jnp.asarray(i, jnp.int32), cache.k, cache.v, logits)


def _write_slot(cache: KVCache, buf: _Prefilled, s):
  """The prompt KV of `buf` into slot `s` (positions [0, W) of that row)."""
  put = lambda c, x: jax.lax.dynamic_update_slice(c, x, (s,) + (0,) * (c.ndim - 1))  # noqa: E731
  return KVCache(tuple(map(put, cache.k, buf.k)), tuple(map(put, cache.v, buf.v)))


def _continuous(graphdef, state, tokens_bw, mask_bw, num_requests, rng, scalars_3, *,
                spec, n: int, slots: int, requests: int, share_prefill: bool) -> _Decoded:
  """The slot loop. Traced once per (shapes, spec, n, slots, share_prefill)."""
  buckets._note_trace()
  model = nnx.merge(graphdef, state)
  w, t_max = tokens_bw.shape[1], spec.max_new_tokens
  fused = {"fused": model.fused_weights()} if hasattr(model, "fused_weights") else {}
  draw = functools.partial(
      sample_tokens, key=None, temperature=scalars_3[0], greedy=spec.greedy, top_k=spec.top_k,
      top_p=scalars_3[1] if spec.use_top_p else None,
      min_p=scalars_3[2] if spec.use_min_p else None)
  if spec.greedy:
    uniform_tr = jnp.zeros((t_max, requests), jnp.float32)
  else:   # the static sampler's draws: step t of request r reads [t, r]
    uniform_tr = jax.vmap(lambda t: row_uniforms(jax.random.fold_in(rng, t), requests))(
        jnp.arange(t_max))

  def sample(logits_sv, step_s, request_s):
    u = uniform_tr[jnp.clip(step_s, 0, t_max - 1), jnp.clip(request_s, 0, requests - 1)]
    return draw(logits_sv, uniform_b=None if spec.greedy else u)

  def record(out, request_s, step_s, tok_s, logp_s, logp_full_s, live_s, truncated_s):
    """Writes column step_s of rows request_s where live_s (others are dropped)."""
    row = jnp.where(live_s, request_s, requests)   # out of range: dropped
    put = lambda buf, x: buf.at[row, step_s].set(x.astype(buf.dtype), mode="drop")  # noqa: E731
    return _Decoded(tokens=put(out.tokens, tok_s), mask=put(out.mask, jnp.ones_like(tok_s)),
                    logp=put(out.logp, logp_s), logp_full=put(out.logp_full, logp_full_s),
                    truncated=out.truncated.at[row].set(truncated_s, mode="drop"))

  def insert(carry):
    sl, buf, next_req, out = carry
    s = jnp.argmax(sl.request < 0)
    r, i = next_req, next_req // n
    if share_prefill:
      buf = jax.lax.cond(buf.prompt == i, lambda: buf,
                         lambda: _prefill_prompt(model, tokens_bw, mask_bw, i, fused))
    else:
      buf = _prefill_prompt(model, tokens_bw, mask_bw, i, fused)
    tok, logp, logp_full = sample(buf.logits, jnp.zeros((1,), jnp.int32), r[None])
    alive = ~_is_stop(tok, spec.stop_tokens) & (t_max > 1)
    out = record(out, r[None], jnp.zeros((1,), jnp.int32), tok, logp, logp_full,
                 jnp.ones((1,), bool), ~_is_stop(tok, spec.stop_tokens))
    mask_w = jax.lax.dynamic_index_in_dim(mask_bw, i, keepdims=False)
    sl = _Slots(cache=_write_slot(sl.cache, buf, s),
                request=sl.request.at[s].set(jnp.where(alive[0], r, -1)),
                step=sl.step.at[s].set(1), token=sl.token.at[s].set(tok[0]),
                prompt_len=sl.prompt_len.at[s].set(jnp.sum(mask_w)),
                prompt_mask=sl.prompt_mask.at[s].set(mask_w))
    return sl, buf, next_req + 1, out

  def decode(carry):
    sl, buf, next_req, out = carry
    live = sl.request >= 0
    kv_mask = jnp.concatenate(
        [sl.prompt_mask, (jnp.arange(t_max)[None, :] < sl.step[:, None]).astype(jnp.int32)],
        axis=1)
    start = jnp.where(live, w + sl.step - 1, w)   # a free slot writes harmlessly at w
    logits, cache = model.forward_cached(
        sl.token[:, None], positions=(sl.prompt_len + sl.step - 1)[:, None], cache=sl.cache,
        start=start, kv_mask=kv_mask, **fused)
    tok, logp, logp_full = sample(logits[:, 0], sl.step, sl.request)
    stop = _is_stop(tok, spec.stop_tokens)
    out = record(out, sl.request, sl.step, tok, logp, logp_full, live, ~stop)
    finished = stop | (sl.step + 1 >= t_max)
    sl = sl._replace(cache=cache, request=jnp.where(live & finished, -1, sl.request),
                     step=jnp.where(live, sl.step + 1, sl.step),
                     token=jnp.where(live, tok, sl.token))
    return sl, buf, next_req, out

  def body(carry):
    sl, _, next_req, _ = carry
    can_insert = jnp.any(sl.request < 0) & (next_req < num_requests)
    return jax.lax.cond(can_insert, insert, decode, carry)

  def cond(carry):
    sl, _, next_req, _ = carry
    return (next_req < num_requests) | jnp.any(sl.request >= 0)

  cache = model.init_cache(slots, w + t_max)
  sl = _Slots(cache=cache, request=jnp.full((slots,), -1, jnp.int32),
              step=jnp.zeros((slots,), jnp.int32), token=jnp.zeros((slots,), jnp.int32),
              prompt_len=jnp.zeros((slots,), jnp.int32),
              prompt_mask=jnp.zeros((slots, w), mask_bw.dtype))
  buf = jax.eval_shape(lambda: _prefill_prompt(model, tokens_bw, mask_bw, 0, fused))
  buf = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), buf)._replace(
      prompt=jnp.asarray(-1, jnp.int32))
  out = _Decoded(tokens=jnp.full((requests, t_max), spec.pad_id, jnp.int32),
                 mask=jnp.zeros((requests, t_max), jnp.int32),
                 logp=jnp.zeros((requests, t_max), jnp.float32),
                 logp_full=jnp.zeros((requests, t_max), jnp.float32),
                 truncated=jnp.zeros((requests,), bool))
  _, _, _, out = jax.lax.while_loop(cond, body, (sl, buf, jnp.int32(0), out))
  return out


_continuous_jit = jax.jit(_continuous, static_argnums=(0,),
                          static_argnames=("spec", "n", "slots", "requests", "share_prefill"))


def continuous_rows(model, tokens_bw, mask_bw, *, sampling: SamplingParams, rng, slots: int,
                    num_requests=None, share_prefill: bool = True, pad_id: int = 0,
                    sampler_dtype=None) -> _Decoded:
  """The slot loop on prompts already padded to a bucket; returns all B·n rows.

  Args:
    tokens_bw, mask_bw: int [B, W] unique prompts, left-padded (bucket rows may be padding).
    sampling: `SamplingParams`; `sampling.n` samples per prompt (requests are prompt-major).
    rng: the PRNG key (same draws as the static sampler's rows).
    slots: S, the decode batch.
    num_requests: how many of the B·n requests are real (default all); the rest stay
      empty (pad tokens, mask 0).
    share_prefill: prefill each prompt once for its n samples (else once per request).
  Returns:
    `_Decoded` (tokens, mask, logp, logp_full [B·n, T]; truncated [B·n]).
  """
  graphdef, state = _split(model, sampler_dtype)
  spec, scalars_3 = _spec_and_scalars(sampling, pad_id)
  requests = tokens_bw.shape[0] * sampling.n
  num = requests if num_requests is None else num_requests
  return _continuous_jit(graphdef, state, jnp.asarray(tokens_bw), jnp.asarray(mask_bw),
                         jnp.asarray(num, jnp.int32), rng, scalars_3, spec=spec, n=sampling.n,
                         slots=int(slots), requests=requests, share_prefill=share_prefill)


def generate_continuous(model: nnx.Module, prompt_tokens, prompt_mask, *,
                        sampling: SamplingParams, rng: jax.Array, slots: int,
                        share_prefill: bool = True, pad_id: int = 0, sampler_dtype=None,
                        prompt_bucket="pow2", batch_bucket="pow2") -> Rollout:
  """`rljax.sampling.generate` with continuous batching over `slots` decode slots.

  Same arguments, same `Rollout` (B·n rows, prompt-major) and, request by request, the
  same tokens and log-probs as `generate` with the same `rng` (float summation order
  aside). Prompts are bucketed like `generate`'s; `slots` is the decode batch: the speed-up
  over the static sampler grows with max/mean completion length when slots < B·n.

  Args:
    slots: S ≥ 1 decode slots (rounded to the request count when larger).
    share_prefill: prefill each distinct prompt once and copy its KV into its n samples'
      slots as they start (n-fold less prefill).
  """
  if not isinstance(sampling, SamplingParams):
    raise TypeError(f"sampling must be a SamplingParams, got {type(sampling).__name__}")
  if int(slots) < 1:
    raise ValueError(f"slots={slots} must be >= 1")
  tokens_bp, mask_bp = _check_prompts(prompt_tokens, prompt_mask)
  b, width = tokens_bp.shape
  rows = buckets.round_up(b, batch_bucket)
  w = buckets.round_up(width, prompt_bucket)
  tokens_bw, mask_bw = buckets.pad_prompts(tokens_bp, mask_bp, rows=rows, width=w,
                                           pad_id=pad_id)
  n = sampling.n
  slots = min(int(slots), b * n)
  out = continuous_rows(model, tokens_bw, mask_bw, sampling=sampling, rng=rng, slots=slots,
                        num_requests=b * n, share_prefill=share_prefill, pad_id=pad_id,
                        sampler_dtype=sampler_dtype)
  if rows != b:
    out = jax.tree.map(lambda x: x[:b * n], out)
  chex.assert_shape(out.tokens, (b * n, sampling.max_new_tokens))
  return Rollout(
      tokens=out.tokens, mask=out.mask, logp=out.logp, logp_full=out.logp_full,
      truncated=out.truncated,
      group_id=jnp.asarray(np.repeat(np.arange(b, dtype=np.int32), n)),
      prompt_tokens=jnp.asarray(np.repeat(tokens_bp, n, axis=0)),
      prompt_mask=jnp.asarray(np.repeat(mask_bp, n, axis=0)))
