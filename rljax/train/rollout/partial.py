"""Partial rollouts: a request still in flight at a weight handoff continues with the new
weights, and every token records the policy version that sampled it.

slime (THUDM/slime, `partial_rollout`) and Kimi k1.5 (arXiv:2501.12599, Sec. 2.6.2) stop
unfinished requests at a weight update and resume them later from their partial output,
re-prefilling the prefix with the new weights. rljax does the same on a fixed schedule so
that a run is reproducible: the T completion columns are cut into segments, segment s is
sampled by `policy.model_at(s)`, and between segments the prompt plus the tokens so far is
prefilled again by the next version (its KV cache is the new policy's, not a stale one).
Rows that ended (stop token) in an earlier segment keep their tokens; the sampler's
log-prob of every token is that of the version that sampled it, which is what the
off-policy correction needs (`rljax.ops.off_policy`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np


def segment_starts(columns: int, segments: int) -> list[int]:
  """Column where each of `segments` near-equal segments of `columns` starts, plus the end."""
  if not 1 <= segments <= columns:
    raise ValueError(f"{segments} segments do not fit {columns} completion columns")
  return [columns * s // segments for s in range(segments + 1)]


def column_versions(columns: int, versions: list[int]) -> np.ndarray:
  """int32 [T]: the version that samples each completion column, segment s by versions[s]."""
  starts = segment_starts(columns, len(versions))
  out = np.empty(columns, np.int32)
  for s, v in enumerate(versions):
    out[starts[s]:starts[s + 1]] = v
  return out


@dataclasses.dataclass
class PartialRows:
  """The rows of a partial rollout after `segment` segments (global arrays, [R, T]).

  Attributes:
    tokens, mask, logp: the completion so far (zeros past a row's end and in later segments).
    active: bool [R], rows that have not ended yet.
    segment: segments done.
  """

  tokens: jax.Array
  mask: jax.Array
  logp: jax.Array
  active: jax.Array
  segment: int = 0


@dataclasses.dataclass
class SegmentedPolicy:
  """The sampler's policy of a partial rollout: what a rollout gets instead of a model.

  Attributes:
    model_at: `model_at(s)` -> the model that samples segment s (it may block until that
      version is published).
    segments: number of segments the completion columns are cut into.
    resume: the rows of segments already sampled (a partial rollout saved at a checkpoint).
    on_segment: called with the `PartialRows` after every segment but the last.
  """

  model_at: Callable[[int], object]
  segments: int
  resume: PartialRows | None = None
  on_segment: Callable[[PartialRows], None] = lambda rows: None


@jax.jit
def _prefix(prompt_tokens, prompt_mask, tokens, mask):
  """prompt ++ completion so far, its real tokens moved to the right (left padding, the
  layout the sampler reads); a row that ended keeps its tokens and its output is dropped."""
  t = jnp.concatenate([prompt_tokens, tokens], axis=1)
  m = jnp.concatenate([prompt_mask, mask], axis=1)
  order = jnp.argsort(m, axis=1, stable=True)   # padding first, real tokens in order
  return jnp.take_along_axis(t, order, axis=1), jnp.take_along_axis(m, order, axis=1)


@jax.jit
def _write(rows_t, rows_m, rows_l, active, out_t, out_m, out_l, out_truncated, start):
  keep = active[:, None]
  put = lambda dst, src: jax.lax.dynamic_update_slice_in_dim(  # noqa: E731
      dst, jnp.where(keep, src, 0).astype(dst.dtype), start, axis=1)
  return (put(rows_t, out_t), put(rows_m, out_m), put(rows_l, out_l),
          active & out_truncated.astype(bool))


def sample_segments(generate, policy: SegmentedPolicy, tokens_rw, mask_rw, *, sampling, rng):
  """Samples `sampling.max_new_tokens` columns segment by segment (module docstring).

  Args:
    generate: `generate(model, tokens, mask, sampling, rng, grouped)` -> `Decoded`, the
      rollout's sampler on left-padded prompt rows (`grouped`: a group's n rows hold one
      prompt, true of segment 0 only).
    policy: the models of the segments.
    tokens_rw, mask_rw: int32 [R, W] left-padded prompt rows, placed.
    rng: the rollout's key; segment s > 0 samples with `fold_in(rng, s)`.
  Returns:
    (tokens, mask, logp [R, T], truncated [R]): `truncated` is a row still unfinished after
    the last segment.
  """
  columns = sampling.max_new_tokens
  starts = segment_starts(columns, policy.segments)
  rows = policy.resume
  if rows is None:
    zeros = jax.device_put(jnp.zeros((tokens_rw.shape[0], columns), jnp.int32),
                           tokens_rw.sharding)
    rows = PartialRows(zeros, zeros, zeros.astype(jnp.float32), zeros[:, 0] == 0)
  for s in range(rows.segment, policy.segments):
    start, stop = starts[s], starts[s + 1]
    prompt = (tokens_rw, mask_rw) if s == 0 else _prefix(
        tokens_rw, mask_rw, rows.tokens[:, :start], rows.mask[:, :start])
    out = generate(policy.model_at(s), *prompt,
                   dataclasses.replace(sampling, max_new_tokens=stop - start),
                   rng if s == 0 else jax.random.fold_in(rng, s), s == 0)
    rows = PartialRows(*_write(rows.tokens, rows.mask, rows.logp, rows.active, out.tokens,
                               out.mask, out.logp, out.truncated, start), segment=s + 1)
    if s + 1 < policy.segments:
      policy.on_segment(rows)
  return rows.tokens, rows.mask, rows.logp, rows.active
