"""Reward-model training (the middle step of RLHF: SFT -> reward model -> PPO; Ouyang et al.
2022, arXiv:2203.02155, Sec. 3.5): AdamW on the K-wise ranking loss of
`rljax.rewards.reward_model.preference_loss`, and a reward model initialised from a Hugging Face
decoder. The command is `rljax reward-model` (`rljax.cli.reward_model`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from rljax.models import RewardModel, load_hf
from rljax.rewards.reward_model import preference_loss
from rljax.train.params import make_optimizer


def reward_model_from_hf(path: str, *, seed: int = 0) -> RewardModel:
  """A `RewardModel` whose trunk is the Hugging Face causal LM in `path` (its lm head dropped)
  and whose scalar head is freshly initialised (`seed`), as InstructGPT starts its reward model
  from the SFT model (arXiv:2203.02155, Sec. 3.5)."""
  decoder, cfg = load_hf(path)
  model = RewardModel(cfg, rngs=nnx.Rngs(seed))
  model.load_trunk(decoder)
  return model


def train_reward_model(model: RewardModel, batches: Iterable[dict], *, steps: int, lr: float,
                       weight_decay: float = 0.0, warmup_steps: int = 0, grad_clip: float = 1.0,
                       log_every: int = 0) -> tuple[RewardModel, list[dict]]:
  """AdamW on the K-wise ranking loss (InstructGPT, arXiv:2203.02155, Eq. 1 and Sec. 3.5).

  Args:
    model: a `RewardModel`, updated in place.
    batches: iterable of dicts {tokens [B,K,S], attention_mask [B,K,S], ranks [B,K],
      mask [B,K]} (e.g. `rljax.rewards.reward_model.preference_batches`); a list is cycled.
    steps: optimizer steps.
    lr: peak learning rate (linear warm-up over `warmup_steps`, then constant).
    weight_decay, grad_clip: AdamW decay; global-norm clip (0: off).
    log_every: print loss/accuracy every this many steps (0: silent).
  Returns:
    (model, history: one {"step", "loss", "accuracy"} per step, training-batch pair accuracy).
  Note: built by `rljax.train.params.make_optimizer` (b1 0.9, b2 0.999, optax's AdamW
  defaults), so with `warmup_steps=0` the first step is taken at `lr`.
  """
  tx = make_optimizer(lr, warmup_steps=warmup_steps, weight_decay=weight_decay, b1=0.9,
                      b2=0.999, grad_clip=grad_clip)
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)

  @jax.jit
  def step(params, opt_state, batch):
    def loss_fn(p):
      return preference_loss(nnx.merge(graphdef, p, rest), batch)
    (loss, acc), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss, acc

  opt_state = tx.init(params)
  source = _cycle(batches) if isinstance(batches, Sequence) else iter(batches)
  history = []
  for i in range(steps):
    batch = {k: jnp.asarray(v) for k, v in next(source).items()}
    params, opt_state, loss, acc = step(params, opt_state, batch)
    history.append({"step": i + 1, "loss": float(loss), "accuracy": float(acc)})
    if log_every and (i + 1) % log_every == 0:
      print(f"reward model step {i + 1}: loss {float(loss):.4f} pair acc {float(acc):.3f}")
  nnx.update(model, params)
  return model, history


def _cycle(items):
  while True:
    yield from items
