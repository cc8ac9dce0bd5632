"""Reduce a per-token loss `[B, T]` to a scalar: the loss-aggregation modes of the RL zoo.

Every mode is a ratio `sum / denominator` (`aggregate_parts`). Both parts are plain sums
over rows, so for micro-batches k = 1..K of one mini-batch

    Σ_k sum_k / Σ_k denominator_k == aggregate(full mini-batch)

exactly, and across devices `psum(sum) / psum(denominator)` is the global value. The
denominator depends only on the mask, so for gradient accumulation compute it once for
the whole mini-batch and divide every micro-batch's `sum` by it (the loss must not
depend on how a batch is split: volcengine/verl#5625).
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from rljax.ops.stats import safe_divide

AGGREGATION_MODES = (
    "token_mean",
    "seq_mean_token_mean",
    "seq_mean_token_sum",
    "seq_mean_token_sum_norm",
)


def _check_mode(mode, max_len):
  if mode not in AGGREGATION_MODES:
    raise ValueError(f"Unknown aggregation mode {mode!r}; valid modes: {AGGREGATION_MODES}")
  if mode == "seq_mean_token_sum_norm":
    if max_len is None:
      raise ValueError(
          "aggregation mode 'seq_mean_token_sum_norm' (Dr.GRPO) needs the constant "
          "normaliser `max_len` (e.g. the maximum completion length); got max_len=None"
      )
    if isinstance(max_len, int | float) and max_len <= 0:
      raise ValueError(f"max_len must be positive, got {max_len}")


def aggregate_parts(per_token, mask, mode, *, max_len=None):
  """The (sum, denominator) pair of an aggregation mode; `aggregate` = sum / denominator.

  With m the mask, |y_i| = Σ_t m_{i,t} and N_seq = #{i : |y_i| > 0}:

  | mode                      | sum                              | denominator |
  |---------------------------|----------------------------------|-------------|
  | `token_mean`              | Σ_i Σ_t m·x                      | Σ_i |y_i|   |
  | `seq_mean_token_mean`     | Σ_i (Σ_t m·x) / |y_i|            | N_seq       |
  | `seq_mean_token_sum`      | Σ_i Σ_t m·x                      | N_seq       |
  | `seq_mean_token_sum_norm` | Σ_i (Σ_t m·x) / max_len          | N_seq       |

  `token_mean` is DAPO's token-level loss (Yu et al. 2025, "DAPO: An Open-Source LLM
  Reinforcement Learning System at Scale", arXiv:2503.14476, Eq. 12);
  `seq_mean_token_mean` is GRPO's (Shao et al. 2024, "DeepSeekMath", arXiv:2402.03300,
  Eq. 3); `seq_mean_token_sum_norm` is Dr.GRPO's constant normaliser (Liu et al. 2025,
  "Understanding R1-Zero-Like Training: A Critical Perspective", arXiv:2503.20783, §3.1,
  `masked_mean(..., constant_normalizer=MAX_TOKENS)`).

  Note: fully masked sequences do not count in N_seq. Trainers pad batches with empty
  rows (to fill a device mesh, after dynamic sampling, or when overlong filtering masks a
  truncated completion); if empty rows counted, such padding would silently shrink the
  loss and its gradient by N_real/B, and the value would depend on how rows are split
  into micro-batches. verl's `seq-mean-*` modes make the same choice. Dr.GRPO divides by
  the number of sequences G as well as by max_len; here that is N_seq.

  Args:
    per_token: values to aggregate, [B, T].
    mask: completion mask, [B, T]; masked values never enter either part.
    mode: one of AGGREGATION_MODES.
    max_len: constant normaliser, required for `seq_mean_token_sum_norm`.
  Returns:
    (sum, denominator), two float32 scalars.
  """
  _check_mode(mode, max_len)
  chex.assert_rank(per_token, 2)
  chex.assert_equal_shape((per_token, mask))
  keep = mask > 0
  x = jnp.where(keep, per_token.astype(jnp.float32), 0.0)
  seq_sum_b = jnp.sum(x, axis=-1)
  length_b = jnp.sum(keep.astype(jnp.float32), axis=-1)
  if mode == "token_mean":
    return jnp.sum(seq_sum_b), jnp.sum(length_b)
  n_seq = jnp.sum((length_b > 0).astype(jnp.float32))
  if mode == "seq_mean_token_mean":
    return jnp.sum(safe_divide(seq_sum_b, length_b)), n_seq
  if mode == "seq_mean_token_sum":
    return jnp.sum(seq_sum_b), n_seq
  return jnp.sum(seq_sum_b) / jnp.asarray(max_len, jnp.float32), n_seq


def aggregate(per_token, mask, mode, *, max_len=None, axis_name=None):
  """Aggregate a per-token loss to a scalar: sum / denominator of `aggregate_parts`.

  See `aggregate_parts` for the modes, their papers and how empty rows count.

  Args:
    per_token: values to aggregate, [B, T].
    mask: completion mask, [B, T].
    mode: one of AGGREGATION_MODES.
    max_len: constant normaliser, required for `seq_mean_token_sum_norm`.
    axis_name: if set, both parts are summed over this mapped device axis first, so
      the result is the aggregate over the global batch.
  Returns:
    float32 scalar; 0 when the denominator is 0 (nothing unmasked).
  """
  total, denominator = aggregate_parts(per_token, mask, mode, max_len=max_len)
  if axis_name is not None:
    total, denominator = jax.lax.psum((total, denominator), axis_name)
  return safe_divide(total, denominator)
