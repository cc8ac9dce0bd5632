"""Building blocks of the decoder: parameters, RoPE, the projections (with LoRA),
the SwiGLU MLP. RMSNorm is in `rljax.models.norm`, attention in `rljax.models.attention`,
the block in `rljax.models.decoder`.

Every parameter carries logical axis names in its `out_sharding` metadata
("vocab", "embed", "mlp", "heads", "kv_heads", "kv", "norm"); `rljax.parallel` maps
them to mesh axes. No mesh axis is named here.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rljax.models.config import ModelConfig, RopeScaling

_INIT_STD = 0.02


def param(rngs: nnx.Rngs, shape, axes, dtype, init="normal") -> nnx.Param:
  """A parameter annotated with logical axis names (one per dimension)."""
  assert len(axes) == len(shape), (shape, axes)
  if init == "normal":
    value = _INIT_STD * jax.random.normal(rngs.params(), shape, dtype)
  elif init == "ones":
    value = jnp.ones(shape, dtype)
  else:
    value = jnp.zeros(shape, dtype)
  return nnx.Param(value, out_sharding=tuple(axes), eager_sharding=False)


def rope_inv_freq(head_dim: int, theta: float, scaling: RopeScaling | None) -> np.ndarray:
  """RoPE inverse frequencies θ_i = theta^(-2i/Dh), optionally with Llama-3 scaling.

  Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding",
  arXiv:2104.09864, Eq. 15. Llama-3 scaling: Dubey et al. 2024, "The Llama 3 Herd of
  Models", arXiv:2407.21783 (Sec. 3.3), as implemented by `transformers`
  (`_compute_llama3_parameters`).

  Returns:
    float32 [Dh/2].
  """
  inv = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / head_dim))
  inv = inv.astype(np.float32)
  if scaling is None:
    return inv
  old_len = scaling.original_max_position_embeddings
  low_wavelen = old_len / scaling.low_freq_factor
  high_wavelen = old_len / scaling.high_freq_factor
  wavelen = 2 * math.pi / inv
  scaled = np.where(wavelen > low_wavelen, inv / scaling.factor, inv)
  smooth = (old_len / wavelen - scaling.low_freq_factor) / (
      scaling.high_freq_factor - scaling.low_freq_factor)
  smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
  medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
  return np.where(medium, smoothed, scaled).astype(np.float32)


def rope_cos_sin(positions_bs, cfg: ModelConfig):
  """cos/sin tables for the given positions: float32 [B,S,Dh] each (halves repeated)."""
  inv = jnp.asarray(rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling))
  freqs = positions_bs.astype(jnp.float32)[..., None] * inv  # [B,S,Dh/2]
  emb = jnp.concatenate([freqs, freqs], axis=-1)  # [B,S,Dh]
  return jnp.cos(emb), jnp.sin(emb)


def apply_rope(x_bshd, cos_bsd, sin_bsd):
  """Rotates pairs (x_i, x_{i+Dh/2}) by position·θ_i (RoFormer Eq. 34, "rotate-half" layout).

  Note: pairs are split in halves (the `transformers` layout), not interleaved as in
  the paper; the two are the same up to a fixed permutation of the weights.
  """
  x = x_bshd.astype(jnp.float32)
  half = x.shape[-1] // 2
  rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
  out = x * cos_bsd[:, :, None, :] + rotated * sin_bsd[:, :, None, :]
  return out.astype(x_bshd.dtype)


def with_lora(module, name, x_bsf, y):
  """y + (α/r)·(x A) B when `module` carries a LoRA adapter for projection `name`, else y.

  The unmerged form of Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language
  Models", arXiv:2106.09685, Eq. 3 (h = W₀x + BAx, scaled by α/r): two thin matmuls, so
  the gradient reaches A and B without materialising W + BA. The adapters are stored in
  float32 and used in the compute dtype of `x`.

  Args:
    x_bsf: the projection's input, flattened over its input axes [..., F_in].
    y: the base projection's output, [..., *out_shape].
  """
  adapter = getattr(module, f"{name}_lora", None)
  if adapter is None:
    return y
  a = adapter.a[...].astype(x_bsf.dtype)
  b = adapter.b[...].astype(x_bsf.dtype)
  r = a.shape[-1]
  delta = dense(dense(x_bsf, a.reshape(-1, r)), b.reshape(r, -1))
  return y + (adapter.scale * delta).astype(y.dtype).reshape(y.shape)


def merged_weight(module, name):
  """The projection's weight with its LoRA update merged in, W + (α/r)·A·B, in float32
  (the weight itself, unchanged, when the module has no adapter for it).

  Also for a stacked module (`rljax.models.stack.LayerStack`): W [n, *in, *out], A
  [n, *in, r] and B [n, r, *out] give n merged weights.
  """
  w = getattr(module, name)[...]
  adapter = getattr(module, f"{name}_lora", None)
  if adapter is None:
    return w
  a, b = adapter.a[...].astype(jnp.float32), adapter.b[...].astype(jnp.float32)
  r = a.shape[-1]
  lead = a.ndim + b.ndim - 2 - w.ndim   # leading (stacked) axes: 0 for one layer
  delta = a.reshape(*a.shape[:lead], -1, r) @ b.reshape(*b.shape[:lead], r, -1)
  return w.astype(jnp.float32) + adapter.scale * delta.reshape(w.shape)


def flat_rows(x_bsf):
  """x [..., F] as [N, F] (N the product of the leading axes), to feed several projections.

  `dense` flattens its input itself; a block whose input feeds several projections (q, k, v;
  gate, up) flattens it once and passes the [N, F] array: with one reshape per projection,
  autodiff kept one copy of the same input per projection for the backward (Qwen2.5-0.5B,
  8 x 192 tokens: 3 x 132 MB more of the update's temporaries)."""
  return x_bsf.reshape(-1, x_bsf.shape[-1])


def dense(x_bsf, w_fd):
  """x W over the last axis, as one 2-D matmul over the flattened leading axes.

  Same value and gradients as `x @ w`. Flattening first makes autodiff's weight
  gradient a plain 2-D xᵀg dot; with the batch axes kept, XLA CPU lowered it with
  transposed copies of the [B·S, F] activations (the MLP's alone were ~20 % of the
  benchmark update step; measured 37 % less CPU time for an MLP block's forward +
  backward, `benchmarks/update_roofline.py`).
  """
  lead = x_bsf.shape[:-1]
  return (x_bsf.reshape(-1, x_bsf.shape[-1]) @ w_fd).reshape(*lead, w_fd.shape[-1])


@jax.custom_vjp
def dense_heads(x_nf, w):
  """x [N, F] times a weight w [*in, *out] whose leading axes hold the F inputs (q/k/v
  [D, H, Dh], o [H, Dh, D]): x · w.reshape(F, -1) -> [N, prod(out)], values and gradients
  as autodiff's.

  Autodiff kept the reshaped weight for the backward: in a scan over stacked layers, a
  stacked copy of every layer's weight (Qwen2.5-0.5B: q, k, v, o, 176 MB). Here the backward
  keeps `w` itself, which the scan reads from the stacked parameter without a copy."""
  return x_nf @ w.reshape(x_nf.shape[-1], -1)


def _dense_heads_fwd(x_nf, w):
  return dense_heads(x_nf, w), (x_nf, w)


def _dense_heads_bwd(res, d_out):
  x_nf, w = res
  return d_out @ w.reshape(x_nf.shape[-1], -1).T, (x_nf.T @ d_out).reshape(w.shape)


dense_heads.defvjp(_dense_heads_fwd, _dense_heads_bwd)


class MLP(nnx.Module):
  """SwiGLU feed-forward, down(silu(x W_gate) ⊙ x W_up).

  Shazeer 2020, "GLU Variants Improve Transformer", arXiv:2002.05202, Eq. 6 (FFN_SwiGLU).
  """

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    d, f, pd = cfg.hidden_size, cfg.intermediate_size, cfg.weight_dtype
    self.dtype = cfg.compute_dtype
    self.gate = param(rngs, (d, f), ("embed", "mlp"), pd)
    self.up = param(rngs, (d, f), ("embed", "mlp"), pd)
    self.down = param(rngs, (f, d), ("mlp", "embed"), pd)

  def fused_gate_up(self):
    """gate|up as one [D, 2F] matrix, for decoding (see `Attention.qkv`); LoRA merged in."""
    return jnp.concatenate([merged_weight(self, "gate"), merged_weight(self, "up")],
                           axis=1).astype(self.dtype)

  def __call__(self, x_bsd, gate_up=None):
    dt, x_nd = self.dtype, flat_rows(x_bsd)
    if gate_up is None:
      g = with_lora(self, "gate", x_nd, dense(x_nd, self.gate[...].astype(dt)))  # [N,F]
      u = with_lora(self, "up", x_nd, dense(x_nd, self.up[...].astype(dt)))  # [N,F]
    else:
      g, u = jnp.split(dense(x_nd, gate_up), 2, axis=-1)
    if getattr(self, "down_lora", None) is None:
      out = swiglu_down(g, u, self.down[...].astype(dt))  # [N,D]
    else:
      hidden = swiglu(g, u)
      out = with_lora(self, "down", hidden, dense(hidden, self.down[...].astype(dt)))
    return out.reshape(x_bsd.shape)


@jax.custom_vjp
def swiglu(g, u):
  """silu(g) ⊙ u, SwiGLU's gating (Shazeer 2020, arXiv:2002.05202, Eq. 6), with its
  gradient written out: d/dg = u·σ(g)·(1 + g·(1 − σ(g))), d/du = g·σ(g).

  Same values as autodiff of `jax.nn.silu(g) * u`, which keeps σ(g) and silu(g) as
  residuals: XLA CPU then writes them in two extra passes over the [N, F] activations.
  Here the forward is one pass and the backward recomputes σ(g) from g and u, which the
  projections already wrote.
  """
  return jax.nn.silu(g) * u


def _swiglu_fwd(g, u):
  return jax.nn.silu(g) * u, (g, u)


def _swiglu_bwd(res, d_hidden):
  g, u = res
  sig = jax.nn.sigmoid(g)
  d_silu = d_hidden * u
  return d_silu * sig * (1 + g * (1 - sig)), d_hidden * g * sig


swiglu.defvjp(_swiglu_fwd, _swiglu_bwd)




@jax.custom_vjp
def swiglu_down(g, u, w_down):
  """`dense(swiglu(g, u), w_down)`, the MLP's last two steps, with the same values and
  gradients, whose backward recomputes swiglu(g, u) instead of keeping it: the down
  projection's weight gradient needs it, so autodiff saves a third [N, F] activation beside
  g and u (Qwen2.5-0.5B update, 8 x 144 tokens: 513 MB of 6.3 GB of temporaries).
  """
  return dense(swiglu(g, u), w_down)


def _swiglu_down_fwd(g, u, w_down):
  return swiglu_down(g, u, w_down), (g, u, w_down)


def _swiglu_down_bwd(res, d_out):
  g, u, w_down = res
  _, dense_vjp = jax.vjp(dense, swiglu(g, u), w_down)
  d_hidden, d_w = dense_vjp(d_out)
  return (*_swiglu_bwd((g, u), d_hidden), d_w)


swiglu_down.defvjp(_swiglu_down_fwd, _swiglu_down_bwd)
