"""The parameters of a run: the policy, its reference and the value model.

`Params` owns what they are (graph definitions, initial values, optimizers, the mesh they
live on), how a fresh `TrainState` is made from them, which parameters score the old and
the reference log-probs (a copy of the start, fetched from host memory when offloaded, or a
LoRA run's base with the adapters off), how the reference is refreshed, and how the state
is checkpointed and restored. A LoRA run differs from full fine-tuning in three places
only, all here: the split of the actor into trainable adapters and a frozen base
(`split`), the merge back (`TrainState.base`, `policy_params`), and the base written once
beside the step checkpoints (`save` / `restore`). On-policy distillation's frozen teacher
(`Teacher`) lives beside them, outside the TrainState.
"""

from rljax.train.params.model_params import Params
from rljax.train.params.state import (
    Checkpointer,
    TrainState,
    clipped_adamw,
    init_optimizer_state,
    make_optimizer,
    place_state,
    policy_params,
)
from rljax.train.params.teacher import Teacher

__all__ = ["Checkpointer", "Params", "Teacher", "TrainState", "clipped_adamw",
           "init_optimizer_state", "make_optimizer", "place_state", "policy_params"]
