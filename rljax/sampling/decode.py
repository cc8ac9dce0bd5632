"""The decode core that every sampler shares: prefill, the segmented decode loop, stop
tests (the host-side preparation of a call is in `rljax.sampling.prepare`).

`rljax.sampling.sampler` (the static sampler), `rljax.sampling.continuous` (continuous
batching) and `rljax.sampling.multiturn` (episodes with environment turns) build their
programs from these pieces. Row r's t-th draw reads a uniform of its own stream
(`streams.stream_uniforms`: (prompt, sample index) by default), so results do not depend on
batch padding, sharding or the row's position.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rljax.models import positions_from_mask
from rljax.models.moe import compact_routes, no_route, route_dtype
from rljax.sampling.filters import sample_tokens
from rljax.sampling.params import SamplingParams
from rljax.sampling.segments import array_bytes, segment_count, segment_ends
from rljax.sampling.streams import stream_uniforms


class DecodeSpec(NamedTuple):
  """The static (trace-time) part of the sampling configuration."""

  max_new_tokens: int
  greedy: bool
  top_k: int
  use_top_p: bool
  use_min_p: bool
  stop_tokens: tuple[int, ...]
  pad_id: int
  # rows come in groups of `group` copies of one prompt (GRPO's n samples): prefill each
  # group's first row only and copy its KV and logits to the others (1: every row)
  group: int = 1


class Decoded(NamedTuple):
  tokens: jax.Array
  mask: jax.Array
  logp: jax.Array
  logp_full: jax.Array
  truncated: jax.Array
  # MoE policies: the experts of every fed token, [R, W + T, L_moe, k] compact ids
  # (`rljax.models.moe.compact_routes`), `no_route` where none was recorded; None if dense
  routes: jax.Array | None = None


def spec_and_scalars(sampling: SamplingParams, pad_id: int, group: int = 1):
  spec = DecodeSpec(sampling.max_new_tokens, sampling.greedy, sampling.top_k,
               sampling.top_p < 1.0, sampling.min_p > 0.0, sampling.stop_tokens, int(pad_id),
               int(group))
  temperature = sampling.temperature if sampling.temperature > 0 else 1.0
  scalars = np.asarray([temperature, sampling.top_p, sampling.min_p], np.float32)
  return spec, scalars


def step_sampler(spec: DecodeSpec, scalars_3, rng, streams_r2):
  """Returns step(t, logits_rv) -> (tokens, logp, logp_full); row r draws from its stream.

  The uniforms of all T steps (T·R values) are drawn before the loop in one vectorised
  call (`stream_uniforms`); draw t of a row depends only on (rng, its stream, t), so a
  longer run extends a shorter one.
  """
  if spec.greedy:
    return step_from_uniforms(spec, scalars_3, None)
  return step_from_uniforms(spec, scalars_3,
                            stream_uniforms(rng, streams_r2, spec.max_new_tokens))


def step_from_uniforms(spec: DecodeSpec, scalars_3, uniform_tr):
  """`step_sampler`'s step, given the uniforms of all steps (uniform_tr [T, R], drawn once
  per generation; None when greedy)."""
  draw = functools.partial(
      sample_tokens, temperature=scalars_3[0], greedy=spec.greedy, top_k=spec.top_k,
      top_p=scalars_3[1] if spec.use_top_p else None,
      min_p=scalars_3[2] if spec.use_min_p else None)
  if uniform_tr is None:
    return lambda t, logits_rv: draw(logits_rv, None)
  return lambda t, logits_rv: draw(
      logits_rv, None, uniform_b=jax.lax.dynamic_index_in_dim(uniform_tr, t, keepdims=False))


def is_stop(tokens_r, stop_tokens):
  if not stop_tokens:
    return jnp.zeros(tokens_r.shape, bool)
  return jnp.any(tokens_r[:, None] == jnp.asarray(stop_tokens, jnp.int32)[None, :], axis=-1)


def is_routed(model) -> bool:
  """Whether the sampler records `model`'s routes (a decoder with MoE layers)."""
  return getattr(model, "num_moe_layers", 0) > 0


def route_buffer(model, rows: int, columns: int):
  """[rows, columns, L_moe, k] of `no_route` (None for a dense model): where routes go."""
  if not is_routed(model):
    return None
  dtype = route_dtype(model.cfg.num_experts)
  shape = (rows, columns, model.num_moe_layers, model.cfg.num_experts_per_tok)
  return jnp.full(shape, no_route(dtype), dtype)


def prefill(model, tokens_rp, positions_rp, cache, kv_mask_rs, fused):
  """Runs the prompt through the model; returns the last position's logits [R, V], the
  cache and the prompt's routes [R, P, L_moe, k] (None for a dense model)."""
  kwargs = dict(positions=positions_rp, cache=cache, start=0, kv_mask=kv_mask_rs, **fused)
  head = getattr(model, "few_row_logits", getattr(model, "logits_from_hidden", None))
  if is_routed(model):
    hidden_rpd, cache, routing = model.hidden_cached_routed(tokens_rp, **kwargs)
    return (head(hidden_rpd[:, -1]), cache,
            compact_routes(routing.expert_ids, model.cfg.num_experts))
  if hasattr(model, "hidden_cached"):   # lm head on the last position only
    hidden_rpd, cache = model.hidden_cached(tokens_rp, **kwargs)
    return head(hidden_rpd[:, -1]), cache, None
  logits_rpv, cache = model.forward_cached(tokens_rp, **kwargs)
  return logits_rpv[:, -1], cache, None


def real_routes(routes_rplk, mask_rp):
  """The prompt's routes on its real tokens, `no_route` on its padding (whose outputs are
  path-specific: the trainer keeps its own routing there)."""
  return jnp.where(mask_rp[:, :, None, None] > 0, routes_rplk, no_route(routes_rplk.dtype))


def decode_forward(model, tokens_r1, **kwargs):
  """`forward_cached` of one new token per row: (logits [R, V], cache, routes [R, L_moe, k]
  or None for a dense model)."""
  if not is_routed(model):
    logits, cache = model.forward_cached(tokens_r1, **kwargs)
    return logits[:, 0], cache, None
  logits, cache, routing = model.forward_cached_routed(tokens_r1, **kwargs)
  return logits[:, 0], cache, compact_routes(routing.expert_ids, model.cfg.num_experts)[:, 0]


def shared_prefill(model, tokens_rp, positions_rp, kv_mask_rp, fused, group: int):
  """Prefill of R rows; with `group` g > 1, of every g-th row, whose KV cache and last
  logits are then repeated g times (rows r·g .. r·g+g-1 hold the same prompt): g-fold less
  prefill compute, the same cache (JetStream's `prefill_multisampling` + `bulk_insert`)."""
  r, p = tokens_rp.shape
  if group > 1 and r % group == 0:
    pick = lambda x: x[::group]  # noqa: E731
    out = prefill(model, pick(tokens_rp), pick(positions_rp),
                  model.init_cache(r // group, p), pick(kv_mask_rp), fused)
    return jax.tree.map(lambda x: jnp.repeat(x, group, axis=0), out)
  return prefill(model, tokens_rp, positions_rp, model.init_cache(r, p), kv_mask_rp, fused)


# Fuse q|k|v and gate|up for a decode loop only while the fused copy is at most this big.
# The copy lives for the whole call: Qwen2.5-0.5B's is 0.94 GB (half its weights), and its
# batch-8 decode ran as fast without it (measured 0.89x the time, load 12-15); the toy
# model's (3.4 M parameters: 8 MB) keeps its few-row steps' wider matmuls.
FUSE_MAX_BYTES = 64 * 2 ** 20


def fused_weights(model) -> dict:
  """`forward_cached`'s `fused=` keyword: q|k|v and gate|up concatenated once, for the
  prefill and every decode step (fewer, wider matmuls); {} for a model without them or
  whose fused copy would exceed `FUSE_MAX_BYTES`."""
  if not hasattr(model, "fused_weights"):
    return {}
  shapes = jax.eval_shape(lambda: [weights for weights, _ in model.fused_weights()])
  if array_bytes(shapes) > FUSE_MAX_BYTES:
    return {}
  return {"fused": model.fused_weights()}


def prefill_rows(model, tokens_rp, mask_rp, spec: DecodeSpec, fused):
  """The prefill of the static sampler (and of the continuous one's resident rows).

  Args:
    tokens_rp, mask_rp: int [R, P] left-padded prompt rows.
    fused: `fused_weights(model)`.
  Returns:
    (last-position logits [R, V], KV cache of P slots, prompt lengths [R], the attention
    mask of all P + T slots [R, P + T], the prompt's routes [R, P, L_moe, k] or None).
  """
  chex.assert_equal_shape((tokens_rp, mask_rp))
  r, p = tokens_rp.shape
  prompt_len_r = jnp.sum(mask_rp, axis=-1)
  positions_rp = positions_from_mask(mask_rp)
  kv_mask_rs = jnp.concatenate([mask_rp, jnp.ones((r, spec.max_new_tokens), mask_rp.dtype)],
                               axis=1)
  last_logits_rv, cache, routes = shared_prefill(model, tokens_rp, positions_rp,
                                                 kv_mask_rs[:, :p], fused, spec.group)
  return last_logits_rv, cache, prompt_len_r, kv_mask_rs, routes


def decode_segments(model, tokens_rp, mask_rp, step, spec: DecodeSpec, *, live_limit=None):
  """The static sampler's prefill and segmented decode loop.

  Args:
    step: `step(t, logits_rv) -> (tokens, logp, logp_full)` for decode step t.
    live_limit: also stop once at most this many rows are still decoding (the
      continuous sampler then drains the rest on fewer rows); None: run to the end.
  Returns:
    the loop carry (t, last tokens [R], cache, `Decoded` with `truncated` = still alive).
  """
  r, p = tokens_rp.shape
  t_max = spec.max_new_tokens
  fused = fused_weights(model)
  last_logits_rv, cache, prompt_len_r, kv_mask_rs, prompt_routes = prefill_rows(
      model, tokens_rp, mask_rp, spec, fused)
  tok_r, logp_r, logp_full_r = step(0, last_logits_rv)
  routes = route_buffer(model, r, p + t_max)
  if routes is not None:
    routes = routes.at[:, :p].set(real_routes(prompt_routes, mask_rp))
  out = Decoded(
      tokens=jnp.full((r, t_max), spec.pad_id, jnp.int32).at[:, 0].set(tok_r),
      mask=jnp.zeros((r, t_max), jnp.int32).at[:, 0].set(1),
      logp=jnp.zeros((r, t_max), jnp.float32).at[:, 0].set(logp_r),
      logp_full=jnp.zeros((r, t_max), jnp.float32).at[:, 0].set(logp_full_r),
      truncated=~is_stop(tok_r, spec.stop_tokens), routes=routes)
  carry = (jnp.int32(1), tok_r, cache, out)
  more = ((lambda c: True) if live_limit is None
          else (lambda c: jnp.sum(c[3].truncated) > live_limit))
  slot_bytes = array_bytes(cache) // cache.max_len
  count = segment_count(array_bytes(nnx.state(model)), slot_bytes, p, t_max)
  for t_end in segment_ends(t_max, max_segments=count):
    # Steps t < t_end write slot p + t - 1 and attend slots [0, p + t): a cache of
    # p + t_end - 1 slots suffices, so early segments read a shorter cache.
    t, tok_r, cache, out = carry
    window = p + t_end - 1
    carry = (t, tok_r, cache.grow(window), out)
    body = functools.partial(decode_step, model, step, spec, prompt_len_r, p,
                             kv_mask_rs[:, :window], fused)
    carry = jax.lax.while_loop(
        lambda c, t_end=t_end: (c[0] < t_end) & jnp.any(c[3].truncated) & more(c), body, carry)
  return carry


def decode_step(model, step, spec: DecodeSpec, prompt_len_r, p: int, kv_mask_rw, fused, carry):
  """One decode step: feed the last token, draw the next, write column t of the outputs."""
  t, tok_r, cache, out = carry
  logits_rv, cache, routes_rlk = decode_forward(
      model, tok_r[:, None], positions=(prompt_len_r + t - 1)[:, None], cache=cache,
      start=p + t - 1, kv_mask=kv_mask_rw, **fused)
  new_r, logp_r, logp_full_r = step(t, logits_rv)
  alive_r = out.truncated
  new_r = jnp.where(alive_r, new_r, spec.pad_id)
  col = lambda buf, x: jax.lax.dynamic_update_slice(buf, x[:, None].astype(buf.dtype), (0, t))
  out = Decoded(
      tokens=col(out.tokens, new_r),
      mask=col(out.mask, alive_r),
      logp=col(out.logp, jnp.where(alive_r, logp_r, 0.0)),
      logp_full=col(out.logp_full, jnp.where(alive_r, logp_full_r, 0.0)),
      truncated=alive_r & ~is_stop(new_r, spec.stop_tokens),
      routes=record_fed(out.routes, routes_rlk, alive_r, p + t - 1))
  return t + 1, new_r, cache, out


def record_fed(routes, routes_rlk, alive_r, column):
  """`routes` [R, W + T, L_moe, k] with the fed token's routes [R, L_moe, k] at `column`
  where the row is alive (None for a dense model)."""
  if routes is None:
    return None
  keep = jax.lax.dynamic_index_in_dim(routes, column, axis=1, keepdims=False)
  new = jnp.where(alive_r[:, None, None], routes_rlk, keep)
  return jax.lax.dynamic_update_slice_in_dim(routes, new[:, None], column, axis=1)
