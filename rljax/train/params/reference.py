"""Reference-policy refresh by mixing: TR-DPO / TRL's soft update (ProRL's reset is α = 1).

The reference parameters live in `TrainState.ref` and are checkpointed with the rest of
the state, so a refreshed reference survives a resume (`Params.refresh_reference`).
"""

from __future__ import annotations

import jax


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
