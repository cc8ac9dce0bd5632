"""Small frozen specs, one per concern: what the runtime reads instead of the config.

`rljax.train.config.from_config.build_specs(config)` builds them once from a validated
config, filling each spec's fields by name from the concerns; everything after it receives
specs (hashable, so the jitted parts can take them as static arguments). A concern that is
its own spec (`RunSpec`, `EvalSetSpec`, `TokenWeightSpec`, `PolicySourcesSpec`) is declared
once, with its config fields; `ShapingSpec` is the `Shaping` concern plus derived values.
"""

from __future__ import annotations

import dataclasses

from rljax.ops.policy_loss import PolicyLossSpec
from rljax.train.config.algo import PolicySourcesSpec, Shaping, TokenWeightSpec
from rljax.train.config.groups import EvalSetSpec, RunSpec

__all__ = [
    "AdvantageSpec", "DistillSpec", "EpisodeSpec", "EvalSetSpec", "LossSpec",
    "PolicySourcesSpec", "RejectionSFTSpec", "RolloutSpec", "RunSpec", "SFTSpec",
    "ScheduleSpec", "ShapingSpec", "Specs", "TokenWeightSpec",
]


@dataclasses.dataclass(frozen=True, kw_only=True)
class ShapingSpec(Shaping):
  """What is added to the verifier's score before advantages (`rljax.ops.shaping`): the
  `algo` shaping fields, the group size and the completion columns."""

  group: int
  max_len: int


@dataclasses.dataclass(frozen=True)
class EpisodeSpec:
  """Multi-turn episodes (`task.env`): the environment, turn limits, what truncated
  episodes contribute, and per-turn credit."""

  env: str
  max_turns: int
  turn_stop: tuple[str, ...]
  max_observation_tokens: int
  timeout: float | None
  reward_only: bool
  on_truncated: tuple[tuple[str, str], ...]   # (status, keep | mask | drop)
  turn_rewards: bool
  gamma: float


@dataclasses.dataclass(frozen=True)
class RolloutSpec:
  """Sampling of the training rollouts and of the held-out evaluation."""

  prompts_per_iteration: int
  n: int
  max_new_tokens: int          # T, the completion columns (a multi-turn episode's budget)
  temperature: float
  top_k: int
  top_p: float
  min_p: float
  continuous: bool
  slots: int
  share_prefill: bool
  dynamic_sampling: bool
  max_rounds: int              # generation rounds per iteration (1 without dynamic sampling)
  greedy_baseline: bool        # also a greedy rollout per prompt (ReMax's baseline)
  eval_n: int
  eval_temperature: float
  eval_passk_n: int = 0
  eval_passk_prompts: int = 0
  max_staleness: int = 0       # batch t is sampled by policy version max(0, t - k)
  partial_rollouts: bool = False   # requests continue with each newer version (k + 1 segments)
  episodes: EpisodeSpec | None = None
  eval_size: int = 0           # held-out prompts evaluated (0: all of task.heldout_size)
  sampler_dtype: str = ""      # "" (the policy's) | bfloat16 | float32: the sampler's copy


@dataclasses.dataclass(frozen=True)
class DistillSpec:
  """On-policy distillation from a frozen teacher (`rljax.ops.distill`)."""

  teacher: str                 # the teacher's directory ("{seed}" resolved)
  recipe: str                  # experiment trained into `teacher` when it has no checkpoint
  seed: int                    # the run's seed (the recipe's)
  coef: float
  mode: str                    # advantage | reward
  only: bool                   # the teacher is the only signal (no task reward)


@dataclasses.dataclass(frozen=True)
class RejectionSFTSpec:
  """Rejection-sampling fine-tuning phases (Llama 2, arXiv:2307.09288, Sec. 3.2.3)."""

  every: int
  k: int
  prompts: int
  steps: int
  lr: float
  min_score: float | None
  from_teacher: bool = False   # the phases sample from the distillation teacher


@dataclasses.dataclass(frozen=True)
class ScheduleSpec:
  """How a rollout batch is consumed: epochs, minibatches, micro-batches, warm-ups."""

  epochs: int
  minibatches: int
  microbatches: int
  critic_warmup_iterations: int
  ptx_coef: float
  rsft: RejectionSFTSpec | None


@dataclasses.dataclass(frozen=True)
class LossSpec:
  """Static choices of the objective (a hashable jit argument)."""

  policy: PolicyLossSpec
  loss_agg: str
  max_len: int
  kl_in_loss: bool
  kl_estimator: str
  kl_is_correction: bool
  entropy_coef: float
  use_critic: bool
  value_clip: float
  vf_coef: float
  ptx_coef: float
  pg_coef: float
  temperature: float
  old_logp_from_update: bool = False
  decoupled_cap: float | None = None   # AReaL's decoupled PPO when set (stale samples)
  pack_groups: int = 0         # packed forward: groups per micro-batch, 0 = padded layout
  routing_replay: bool = False  # MoE: the current policy's forward uses the sampler's experts
  moe_aux_loss_coef: float = 0.0   # Switch load-balancing loss (per MoE layer, summed)
  moe_z_loss_coef: float = 0.0     # ST-MoE router z-loss (token mean, summed over layers)


@dataclasses.dataclass(frozen=True)
class AdvantageSpec:
  """Static choices of the advantage estimate (a hashable jit argument)."""

  estimator: str
  kwargs: tuple                # the estimator's own arguments, sorted (name, value) pairs
  group_size: int
  gamma: float
  lam: float
  whiten: bool
  kl_in_reward: bool
  kl_estimator: str
  # GDPO (algo.reward_aggregation="normalize_then_sum"): weights of the reward components,
  # set once the run's reward is built; empty: the weighted sum is the score
  reward_weights: tuple = ()
  eps: float = 1e-6
  gdpo_whiten_over: str = "samples"
  sampling_sum_sq: bool = False   # the estimator reads the sampling policy's Σ_v π_v² (OTB)


@dataclasses.dataclass(frozen=True)
class SFTSpec:
  """The supervised warm start and its cache."""

  steps: int
  batch_size: int
  lr: float
  warmup_steps: int
  end_lr_fraction: float
  worked_steps: int
  completion_len: int
  cache_dir: str
  cache_key: str
  # the held-out evaluation of the start, cached beside it (it depends on the start, the
  # evaluation settings, the model's adapters and the mesh, not on the RL fields)
  heldout_key: str = ""


@dataclasses.dataclass(frozen=True)
class Specs:
  """Everything the runtime reads, by concern."""

  run: RunSpec
  rollout: RolloutSpec
  shaping: ShapingSpec
  sources: PolicySourcesSpec
  weights: TokenWeightSpec
  schedule: ScheduleSpec
  loss: LossSpec
  advantage: AdvantageSpec
  sft: SFTSpec
  distill: DistillSpec | None = None
  eval_sets: tuple[EvalSetSpec, ...] = ()


