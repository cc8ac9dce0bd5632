"""`Params`: the parameters of the run's models (the policy, its reference and the value model)
and how they become, and come back from, a TrainState (see the package doc)."""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
from flax import nnx

from rljax import parallel
from rljax.models.heads import ValueModel
from rljax.train.config.specs import PolicySourcesSpec
from rljax.train.params import offload
from rljax.train.params.reference import mix_reference
from rljax.train.params.state import (
    TrainState,
    init_optimizer_state,
    place_state,
    policy_params,
)
from rljax.train.params.teacher import Teacher


@dataclasses.dataclass
class Params:
  """What the run's parameters are and how they become, and come back from, a TrainState.

  Attributes:
    actor_graphdef, critic_graphdef: `nnx.split` graph definitions (critic: None without one).
    initial_actor, initial_critic: their freshly built parameters (nnx.State).
    actor_tx, critic_tx: optax optimizers.
    mesh: where every parameter lives.
    sources: the reference settings (KL placement, offload, refresh).
    seed: the run seed (the state's PRNG key, the critic head's initialisation).
    lora: the actor holds LoRA adapters: only they train; the base is frozen and is the
      reference (adapters off).
    critic_from_policy: a fresh critic starts from the warm-started policy's trunk.
    teacher: the frozen teacher of on-policy distillation (`params.teacher.Teacher`), or
      None. Outside the TrainState: no gradient, no optimizer state, no checkpoint.
  """

  actor_graphdef: object
  critic_graphdef: object
  initial_actor: object
  initial_critic: object
  actor_tx: object
  critic_tx: object
  mesh: object
  sources: PolicySourcesSpec
  seed: int
  lora: bool = False
  critic_from_policy: bool = True
  sampler_mesh: object = None   # the sampler's own devices (None: it shares `mesh`)
  teacher: Teacher | None = None

  def split(self, actor_params):
    """(trainable, frozen base or None): a LoRA actor's adapters and the rest of its full
    parameters; (all of them, None) for full fine-tuning."""
    if not self.lora:
      return actor_params, None
    return nnx.split_state(actor_params, nnx.LoRAParam, ...)

  def model(self, state: TrainState, *, adapters: bool = True):
    """The policy (or, with `adapters=False`, a LoRA run's base) as a module."""
    return nnx.merge(self.actor_graphdef, policy_params(state, adapters=adapters))

  def sampler_model(self, state: TrainState, *, keep: bool = False):
    """(the policy on the sampler's devices, handover metrics): the trainer's parameters
    resharded to the sampler's mesh (`jax.device_put` to their logical-axis shardings
    there: `sync/seconds`, `sync/bytes`), or the policy itself when colocated (`keep`: a
    copy, for a sampler that outlives the next update, whose step donates the state)."""
    if self.sampler_mesh is None and not keep:
      return self.model(state), {}
    if self.sampler_mesh is None:
      return nnx.merge(self.actor_graphdef,
                       jax.tree.map(jnp.copy, policy_params(state))), {}
    t0 = time.perf_counter()
    params = policy_params(state)
    moved = jax.block_until_ready(
        parallel.move(params, parallel.state_shardings(params, self.sampler_mesh)))
    size = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(moved))
    return nnx.merge(self.actor_graphdef, moved), {"sync/seconds": time.perf_counter() - t0,
                                                    "sync/bytes": float(size)}

  def init_state(self, actor_params, critic_params=None) -> TrainState:
    """A fresh TrainState around (possibly warm-started) full actor parameters, placed on
    the mesh, with a copy of the actor as the reference when the run has one (in host
    memory with `algo.reference_offload`; a LoRA run needs none: its base is the reference).
    """
    actor, base = self.split(actor_params)
    critic = self.initial_critic if critic_params is None else critic_params
    copy_reference = self.sources.has_reference and base is None
    state = TrainState(
        step=jnp.zeros((), jnp.int32), iteration=jnp.zeros((), jnp.int32),
        actor=actor, actor_opt=init_optimizer_state(self.actor_tx, actor),
        critic=critic,
        critic_opt=init_optimizer_state(self.critic_tx, critic) if critic is not None else None,
        base=base, ref=jax.tree.map(jnp.copy, actor) if copy_reference else None,
        kl_coef=jnp.asarray(self.sources.kl_coef, jnp.float32),
        rng=jax.random.key_data(jax.random.key(self.seed)),
        skipped_updates=jnp.zeros((), jnp.int32), nonfinite_in_row=jnp.zeros((), jnp.int32))
    state = place_state(state, self.mesh)
    if copy_reference and self.sources.reference_offload:
      state = state._replace(ref=offload.to_host(state.ref))   # host memory between uses
    return state

  def fresh_state(self, warm_start) -> TrainState:
    """The state a new run starts from: the actor warm-started by `warm_start(params,
    frozen=(...)) -> params` (a LoRA run warm-starts its base; its fresh adapters, B = 0,
    stay as they are), and a critic from the warm-started policy's trunk."""
    trainable, frozen = self.split(self.initial_actor)
    if frozen is None:
      actor = warm_start(trainable)
    else:
      actor = nnx.merge_state(warm_start(frozen, frozen=(trainable,)), trainable)
    critic = None
    if self.initial_critic is not None and self.critic_from_policy:
      value = ValueModel.from_policy(nnx.merge(self.actor_graphdef, actor),
                                     rngs=nnx.Rngs(self.seed + 1))
      critic = nnx.state(parallel.shard_model(value, self.mesh))
    return self.init_state(actor, critic)

  def has_reference(self, state: TrainState) -> bool:
    """Whether the run scores a reference policy (a copy, or a LoRA base)."""
    return state.ref is not None or (state.base is not None and self.sources.has_reference)

  def reference_params(self, state: TrainState):
    """The reference policy's parameters on the devices (None without a reference)."""
    if state.ref is not None:   # (host-offloaded parameters visit the devices just for this)
      return offload.fetch(state.ref, state.actor)
    if self.has_reference(state):
      return policy_params(state, adapters=False)
    return None

  def refresh_reference(self, state: TrainState, iteration: int) -> TrainState:
    """The state with its reference refreshed when due: TR-DPO's mix or ProRL's reset (and
    then, with `algo.ref_reset_optimizer`, a fresh actor optimizer).

    ProRL: Liu et al. 2025, arXiv:2505.24864 (reference policy reset: hard-reset the
    reference to the current policy, and the optimizer states, when the KL term dominates);
    resetting the optimizer restarts its step count, hence its warm-up.
    """
    s = self.sources
    if state.ref is None or not refresh_due(s, iteration):
      return state
    ref = offload.fetch(state.ref, state.actor) if s.reference_offload else state.ref
    alpha = 1.0 if s.ref_refresh == "reset" else s.ref_mix_alpha
    new_ref = jax.tree.map(lambda n, old: jax.device_put(n, old.sharding),
                           mix_reference(ref, state.actor, alpha=alpha), ref)
    state = state._replace(ref=offload.to_host(new_ref) if s.reference_offload else new_ref)
    if s.ref_refresh == "reset" and s.ref_reset_optimizer:
      fresh = init_optimizer_state(self.actor_tx, state.actor)
      state = state._replace(actor_opt=jax.tree.map(
          lambda n, old: jax.device_put(n, old.sharding), fresh, state.actor_opt))
    return state

  def save(self, ckpt, step: int, state: TrainState, host: dict) -> None:
    """A step checkpoint of everything that trains (a LoRA base is written once, by
    `save_frozen`, when the run starts)."""
    ckpt.save(step, state._replace(base=None), host)

  def restore(self, ckpt, template: TrainState):
    """(step, state, host state) of the newest readable checkpoint, restored into the
    structure and shardings of `template`; None when there is none (or a LoRA run's base is
    missing)."""
    restored = ckpt.restore_latest(template._replace(base=None))
    base = ckpt.restore_frozen(template.base)   # written once, beside the checkpoints
    if restored is None or (base is None) != (template.base is None):
      return None
    step, state, host = restored
    return step, state._replace(base=base), host

  def save_frozen(self, ckpt, state: TrainState) -> None:
    """Writes a LoRA run's frozen base once, beside the step checkpoints."""
    ckpt.save_frozen(state.base)


def refresh_due(sources: PolicySourcesSpec, iteration: int) -> bool:
  """True after iteration `iteration` (0-based) when the reference is to be refreshed."""
  every = sources.ref_refresh_every
  return sources.ref_refresh != "none" and every > 0 and (iteration + 1) % every == 0
