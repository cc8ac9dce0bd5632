"""Scalar heads: PPO value model (critic) and sequence reward model.

Both use the decoder trunk's final-normed hidden states and a linear map D -> 1.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
from flax import nnx

from rljax.models.config import ModelConfig
from rljax.models.decoder import Decoder


class ScalarHead(nnx.Module):
  """v = h·w + b, one float32 scalar per position.

  Ouyang et al. 2022, "Training language models to follow instructions with human
  feedback" (InstructGPT), arXiv:2203.02155, Sec. 3.5: "a scalar output" projection on
  the final-layer hidden state, for the reward model and (initialised from it) the
  value function.
  """

  def __init__(self, hidden_size: int, *, rngs: nnx.Rngs, param_dtype=jnp.float32):
    std = 1.0 / (hidden_size + 1) ** 0.5
    self.w = nnx.Param(std * jax.random.normal(rngs.params(), (hidden_size,), param_dtype),
                       out_sharding=("embed",), eager_sharding=False)
    self.b = nnx.Param(jnp.zeros((), param_dtype), out_sharding=(), eager_sharding=False)

  def __call__(self, hidden_bsd):
    """[..., D] -> float32 [...]."""
    h = hidden_bsd.astype(jnp.float32)
    return h @ self.w[...].astype(jnp.float32) + self.b[...].astype(jnp.float32)


def _trunk_config(cfg: ModelConfig) -> ModelConfig:
  # The trunk never applies an lm head; tying avoids allocating an unused [D,V] matrix.
  return cfg.replace(tie_embeddings=True)


class _ScalarModel(nnx.Module):
  """A decoder trunk (no lm head) plus a `ScalarHead`."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.trunk = Decoder(_trunk_config(cfg), rngs=rngs)
    self.head = ScalarHead(cfg.hidden_size, rngs=rngs, param_dtype=cfg.weight_dtype)

  def per_token(self, tokens_bs, *, positions, attention_mask):
    """Scalar at every position, float32 [B,S]."""
    hidden = self.trunk.hidden_states(tokens_bs, positions=positions,
                                      attention_mask=attention_mask)
    return self.head(hidden)

  def load_trunk(self, source: Decoder | _ScalarModel) -> None:
    """Copies trunk weights (embedding, blocks, final norm) from a policy or another head model.

    A `_ScalarModel` source also gives its scalar head (critic from reward model).
    """
    src = source.trunk if isinstance(source, _ScalarModel) else source
    no_lm_head = nnx.All(nnx.Param, nnx.Not(nnx.PathContains("lm_head")))
    nnx.update(self.trunk, jax.tree.map(jnp.copy, nnx.state(src, no_lm_head)))
    if isinstance(source, _ScalarModel):
      nnx.update(self.head, jax.tree.map(jnp.copy, nnx.state(source.head, nnx.Param)))


class ValueModel(_ScalarModel):
  """PPO critic with its own trunk: values V(s_t) at every position, float32 [B,S].

  Schulman et al. 2017, "Proximal Policy Optimization Algorithms", arXiv:1707.06347,
  Eq. 9 (value term L^VF); initialised from the reward model as in InstructGPT
  (arXiv:2203.02155, Sec. 3.5): `ValueModel.from_reward_model(rm)`.
  """

  def __call__(self, tokens_bs, *, positions, attention_mask):
    return self.per_token(tokens_bs, positions=positions, attention_mask=attention_mask)

  @classmethod
  def from_reward_model(cls, reward_model: RewardModel) -> ValueModel:
    """A critic whose trunk and head are copies of the reward model's."""
    critic = nnx.eval_shape(lambda: cls(reward_model.cfg, rngs=nnx.Rngs(0)))
    nnx.update(critic, jax.tree.map(jnp.copy, nnx.state(reward_model, nnx.Param)))
    return critic

  @classmethod
  def from_policy(cls, policy: Decoder, *, rngs: nnx.Rngs) -> ValueModel:
    """A critic whose trunk copies the policy's; the head is freshly initialised."""
    critic = cls(policy.cfg, rngs=rngs)
    critic.load_trunk(policy)
    return critic


class RewardModel(_ScalarModel):
  """Sequence reward r(x, y): the scalar head at the last real token (the EOS token).

  Ouyang et al. 2022 (InstructGPT), arXiv:2203.02155, Eq. 1 (r_θ(x, y) on the final token).
  """

  def __call__(self, tokens_bs, *, positions, attention_mask):
    """Per-position scores, float32 [B,S] (the reward is the one at the last real token)."""
    return self.per_token(tokens_bs, positions=positions, attention_mask=attention_mask)

  def score(self, tokens_bs, positions, attention_mask, last_index_b):
    """Reward of each sequence, float32 [B].

    Args:
      tokens_bs, positions, attention_mask: [B,S] as for `Decoder.__call__`.
      last_index_b: int [B], index in S of the last real token (the EOS) of each sequence.
    """
    chex.assert_shape(last_index_b, (tokens_bs.shape[0],))
    hidden = self.trunk.hidden_states(tokens_bs, positions=positions,
                                      attention_mask=attention_mask)  # [B,S,D]
    last = jnp.take_along_axis(hidden, last_index_b[:, None, None].astype(jnp.int32), axis=1)
    return self.head(last[:, 0])  # [B]


def last_token_index(attention_mask_bs):
  """Index of the last real token of each row of a [B,S] mask (right- or left-padded) -> [B]."""
  s = attention_mask_bs.shape[1]
  return s - 1 - jnp.argmax(attention_mask_bs[:, ::-1] > 0, axis=1)
