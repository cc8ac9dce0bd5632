"""Reference-policy refresh: TR-DPO / TRL mixing and ProRL's hard reset.

The reference parameters live in `TrainState.ref` and are checkpointed with the rest of
the state, so a refreshed reference survives a resume.
"""

from __future__ import annotations

import jax

from rljax.train import offload, update

REF_REFRESH_MODES = ("none", "mix", "reset")


def mix_reference(ref, policy, *, alpha):
  """π_ref ← α·π_θ + (1 − α)·π_ref, leaf by leaf in parameter space.

  Gorbatovski et al. 2024, "Learn Your Reference Model for Real Good Alignment"
  (TR-DPO), arXiv:2404.09656, the soft update; TRL `sync_ref_model` with
  `ref_model_mixup_alpha` (0.6) every `ref_model_sync_steps`. α = 1 is a hard reset.

  Args:
    ref, policy: parameter pytrees of the same structure.
    alpha: α in [0, 1].
  Returns:
    the mixed pytree, with the reference's dtypes.
  """
  return jax.tree.map(lambda r, p: (alpha * p + (1.0 - alpha) * r).astype(r.dtype), ref, policy)


def refresh_due(algo, iteration) -> bool:
  """True after iteration `iteration` (0-based) when the reference is to be refreshed."""
  every = algo.ref_refresh_every
  return algo.ref_refresh != "none" and every > 0 and (iteration + 1) % every == 0


def refresh_reference(setup, state, iteration):
  """The state with its reference refreshed when due (and the actor's optimizer reset for
  ProRL's hard reset with `algo.ref_reset_optimizer`); otherwise unchanged.

  "reset" is ProRL's reference reset (Liu et al. 2025, "ProRL: Prolonged Reinforcement
  Learning Expands Reasoning Boundaries in Large Language Models", arXiv:2505.24864,
  reference policy reset: hard-reset the reference to the current policy, and the optimizer states, when the KL
  term dominates). Resetting the optimizer restarts its step count, hence its warm-up.
  """
  a = setup.config.algo
  if state.ref is None or not refresh_due(a, iteration):
    return state
  on_host = a.reference_offload
  ref = offload.fetch(state.ref, state.actor) if on_host else state.ref
  alpha = 1.0 if a.ref_refresh == "reset" else float(a.ref_mix_alpha)
  new_ref = jax.tree.map(lambda n, old: jax.device_put(n, old.sharding),
                         mix_reference(ref, state.actor, alpha=alpha), ref)
  state = state._replace(ref=offload.to_host(new_ref) if on_host else new_ref)
  if a.ref_refresh == "reset" and a.ref_reset_optimizer:
    fresh = update.init_optimizer_state(setup.actor_tx, state.actor)
    state = state._replace(actor_opt=jax.tree.map(
        lambda n, old: jax.device_put(n, old.sharding), fresh, state.actor_opt))
  return state
