"""Memory-linear attention in plain XLA: query blocks x key blocks with an online softmax.

Any device runs it; it is `model.attention=chunked` (`rljax.models.attention_kernels`).
"""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp

_F32 = jnp.float32
_NEG = float(jnp.finfo(jnp.float32).min)


def chunked_attention(q_bshd, k_bktd, v_bktd, kv_valid_bt, start_b, segment_ids=None, *,
                      causal: bool = True, block_q: int = 256, block_k: int = 256):
  """softmax(q kᵀ + mask) v, one [block_q, block_k] tile of scores at a time.

  Rabe & Staats 2021, "Self-attention Does Not Need O(n²) Memory", arXiv:2112.05682
  (Sec. 2-3: chunked queries and keys, softmax by running max and sum); Dao et al. 2022,
  "FlashAttention", arXiv:2205.14135 (Algorithm 1, the forward's online softmax; Algorithm 4,
  the backward recomputing P = exp(S - L) per tile from the saved log-sum-exp L).

  Query i of row b sits at slot start[b] + i; it sees key slot t iff kv_valid[b, t], and
  t <= start[b] + i when `causal`, and segment_ids[0][b, i] == segment_ids[1][b, t] when
  segment ids are given. The mask is computed per tile from these vectors: no [B,S,T] (or
  [B,H,S,T]) array exists in the forward or the backward, whose memory is one tile's scores
  plus O(S + T). Tiles with no visible key are skipped (`lax.cond`): about half of them
  when causal.

  Args:
    q_bshd: queries [B,S,H,Dh], already scaled by 1/sqrt(Dh).
    k_bktd, v_bktd: keys and values [B,K,T,Dh] (heads before time); H is a multiple of K.
    kv_valid_bt: bool [B,T], True = the slot holds a real token.
    start_b: int [B] (or a scalar), the slot of each row's first query.
    segment_ids: None, or (query segments int [B,S], key segments int [B,T]).
    causal: mask keys after the query's slot.
    block_q, block_k: tile sizes (at most; S and T are split into equal tiles of a multiple
      of 8, and padded to a whole number of them).
  Returns:
    [B,S,H,Dh] in the value dtype.

  Note: a query that sees no key at all (a left-padding token) gets 0, where the
  materialised softmax (`attention.masked_softmax`) averages every value; those rows are
  padding and never read. Scores and sums are float32; P·V and the gradients' matmuls
  take P and dS in the input dtype (FlashAttention-2, arXiv:2307.08691, Sec. 3.1), with
  float32 accumulation.
  """
  b, s, h, d = q_bshd.shape
  kh, t = k_bktd.shape[1], k_bktd.shape[2]
  chex.assert_shape([k_bktd, v_bktd], (b, kh, t, d))
  chex.assert_shape(kv_valid_bt, (b, t))
  bq, nq = _tiles(s, block_q)
  bk, nk = _tiles(t, block_k)
  q = q_bshd.reshape(b, s, kh, h // kh, d).transpose(0, 2, 3, 1, 4)   # [B,K,G,S,Dh]
  q = jnp.pad(q, ((0, 0),) * 3 + ((0, bq * nq - s), (0, 0)))
  pad_t = ((0, 0), (0, 0), (0, bk * nk - t), (0, 0))
  k, v = jnp.pad(k_bktd, pad_t), jnp.pad(v_bktd, pad_t)
  valid = jnp.pad(kv_valid_bt.astype(bool), ((0, 0), (0, bk * nk - t)))
  start = jnp.broadcast_to(jnp.asarray(start_b, jnp.int32), (b,))
  seg = None
  if segment_ids is not None:
    chex.assert_shape(segment_ids, ((b, s), (b, t)))
    seg = (jnp.pad(segment_ids[0], ((0, 0), (0, bq * nq - s))),
           jnp.pad(segment_ids[1], ((0, 0), (0, bk * nk - t))))
  out = _attention(q, k, v, valid, start, seg, causal, bq, bk)   # [B,K,G,S',Dh]
  return out[:, :, :, :s].transpose(0, 3, 1, 2, 4).reshape(b, s, h, d)


def _tiles(n, most):
  """(tile, count): `count` equal tiles of a multiple of 8 rows covering n (>= n)."""
  count = _ceil_div(n, most)
  return _ceil_div(_ceil_div(n, count), 8) * 8, count


def _ceil_div(a, b):
  return -(-a // b)


def _tile_mask(valid, start, seg, causal, i, j, bq, bk):
  """bool [B,bq,bk]: which keys of tile j the queries of tile i see."""
  mask = jax.lax.dynamic_slice_in_dim(valid, j * bk, bk, axis=1)[:, None, :]
  if causal:
    q_slot = start[:, None] + i * bq + jnp.arange(bq)                   # [B,bq]
    mask = mask & (j * bk + jnp.arange(bk) <= q_slot[:, :, None])
  if seg is not None:
    q_seg = jax.lax.dynamic_slice_in_dim(seg[0], i * bq, bq, axis=1)
    k_seg = jax.lax.dynamic_slice_in_dim(seg[1], j * bk, bk, axis=1)
    mask = mask & (q_seg[:, :, None] == k_seg[:, None, :])
  return mask


def _scores(q_i, k_j):
  return jnp.einsum("bkgqd,bktd->bkgqt", q_i, k_j, preferred_element_type=_F32)


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7, 8))
def _attention(q, k, v, valid, start, seg, causal, bq, bk):
  return _forward(q, k, v, valid, start, seg, causal, bq, bk)[0]


def _forward(q, k, v, valid, start, seg, causal, bq, bk):
  """(out [B,K,G,S,Dh] value dtype, log-sum-exp [B,K,G,S] float32, 0 for unseeing rows)."""
  b, kh, g, s, d = q.shape
  nq, nk = s // bq, k.shape[2] // bk

  def query_tile(i):
    q_i = jax.lax.dynamic_slice_in_dim(q, i * bq, bq, axis=3)

    def key_tile(carry, j):
      mask = _tile_mask(valid, start, seg, causal, i, j, bq, bk)[:, None, None]

      def visit(carry):
        m, total, acc = carry
        v_j = jax.lax.dynamic_slice_in_dim(v, j * bk, bk, axis=2)
        scores = _scores(q_i, jax.lax.dynamic_slice_in_dim(k, j * bk, bk, axis=2))
        m_new = jnp.maximum(m, jnp.max(jnp.where(mask, scores, _NEG), axis=-1))
        p = jnp.where(mask, jnp.exp(scores - m_new[..., None]), 0.0)
        alpha = jnp.exp(m - m_new)
        pv = jnp.einsum("bkgqt,bktd->bkgqd", p.astype(v.dtype), v_j, preferred_element_type=_F32)
        return m_new, alpha * total + jnp.sum(p, axis=-1), alpha[..., None] * acc + pv

      return jax.lax.cond(jnp.any(mask), visit, lambda c: c, carry), None

    init = (jnp.full((b, kh, g, bq), _NEG, _F32), jnp.zeros((b, kh, g, bq), _F32),
            jnp.zeros((b, kh, g, bq, d), _F32))
    (m, total, acc), _ = jax.lax.scan(key_tile, init, jnp.arange(nk))
    seen = total > 0
    total = jnp.where(seen, total, 1.0)
    return (acc / total[..., None]).astype(v.dtype), jnp.where(seen, m + jnp.log(total), 0.0)

  out, lse = jax.lax.map(query_tile, jnp.arange(nq))      # [nq,B,K,G,bq,(Dh)]
  return (jnp.moveaxis(out, 0, 3).reshape(b, kh, g, s, d),
          jnp.moveaxis(lse, 0, 3).reshape(b, kh, g, s))


def _attention_fwd(q, k, v, valid, start, seg, causal, bq, bk):
  out, lse = _forward(q, k, v, valid, start, seg, causal, bq, bk)
  return out, (q, k, v, valid, start, seg, out, lse)


def _attention_bwd(causal, bq, bk, residuals, dout):
  """FlashAttention's backward (arXiv:2205.14135, Algorithm 4): per key tile, a pass over the
  query tiles accumulating dK_j, dV_j and adding each dQ_i in place; P recomputed from L.

  Note: the skipped-tile `lax.cond` carries only tile-sized arrays; dQ (the whole [S,Dh]
  accumulator) is updated outside it, as a conditional over the whole buffer made XLA copy
  it on every tile."""
  q, k, v, valid, start, seg, out, lse = residuals
  delta = jnp.sum(dout.astype(_F32) * out.astype(_F32), axis=-1)    # [B,K,G,S]
  nq, nk = q.shape[3] // bq, k.shape[2] // bk
  cut = lambda x, i, n, axis: jax.lax.dynamic_slice_in_dim(x, i * n, n, axis=axis)  # noqa: E731

  def key_tile(dq, j):
    k_j, v_j = cut(k, j, bk, 2), cut(v, j, bk, 2)

    def query_tile(carry, i):
      dq, dk, dv = carry
      mask = _tile_mask(valid, start, seg, causal, i, j, bq, bk)[:, None, None]
      q_i, do_i = cut(q, i, bq, 3), cut(dout, i, bq, 3)

      def visit(dk, dv):
        p = jnp.where(mask, jnp.exp(_scores(q_i, k_j) - cut(lse, i, bq, 3)[..., None]), 0.0)
        dv = dv + jnp.einsum("bkgqt,bkgqd->bktd", p.astype(do_i.dtype), do_i,
                             preferred_element_type=_F32)
        dp = jnp.einsum("bkgqd,bktd->bkgqt", do_i, v_j, preferred_element_type=_F32)
        ds = (p * (dp - cut(delta, i, bq, 3)[..., None])).astype(q.dtype)
        dk = dk + jnp.einsum("bkgqt,bkgqd->bktd", ds, q_i, preferred_element_type=_F32)
        return dk, dv, jnp.einsum("bkgqt,bktd->bkgqd", ds, k_j, preferred_element_type=_F32)

      skip = lambda dk, dv: (dk, dv, jnp.zeros(q_i.shape, _F32))  # noqa: E731
      dk, dv, dq_i = jax.lax.cond(jnp.any(mask), visit, skip, dk, dv)
      dq = jax.lax.dynamic_update_slice_in_dim(dq, cut(dq, i, bq, 3) + dq_i, i * bq, axis=3)
      return (dq, dk, dv), None

    zeros = jnp.zeros(k_j.shape, _F32)
    (dq, dk, dv), _ = jax.lax.scan(query_tile, (dq, zeros, zeros), jnp.arange(nq))
    return dq, (dk, dv)

  dq, (dk, dv) = jax.lax.scan(key_tile, jnp.zeros(q.shape, _F32), jnp.arange(nk))
  tiles = lambda x: jnp.moveaxis(x, 0, 2).reshape(k.shape)  # noqa: E731   [nk,B,K,bk,Dh]
  return (dq.astype(q.dtype), tiles(dk).astype(k.dtype), tiles(dv).astype(v.dtype),
          None, None, None)


_attention.defvjp(_attention_fwd, _attention_bwd)
