"""Small frozen specs, one per concern, and `build_specs`, the one place that makes them.

The specs are what the runtime reads instead of the config: hashable, so the jitted parts
can take them as static arguments. A concern that is its own spec (`RunSpec`, `EvalSetSpec`,
`TokenWeightSpec`, `PolicySourcesSpec`, `RejectionSFTSpec`) is declared once, with its config
fields; a spec that extends a concern (`ShapingSpec`, `RolloutSpec`, `ScheduleSpec`,
`AdvantageSpec`, `DistillSpec`, `SFTSpec`) adds only the values derived from other concerns;
the other specs name their fields as the config does. `build_specs` fills every spec by one
generic function, `fill`, and computes the derived values once; nothing is written back.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

from rljax.ops.estimators import estimator_kwargs
from rljax.ops.policy_loss import PolicyLossSpec, policy_loss_spec
from rljax.train.config import algo
from rljax.train.config.algo import (
    Advantages,
    Distill,
    PolicySourcesSpec,
    RejectionSFTSpec,
    Schedule,
    Shaping,
    TokenWeightSpec,
)
from rljax.train.config.defaults import (
    EvalSetSpec,
    base_config,
    completion_columns,
    distill_teacher_dir,
    resolved_eval_sets,
)
from rljax.train.config.fields import read
from rljax.train.config.groups import SFT, RunSpec, Sampling, Task

__all__ = [
    "AdvantageSpec", "DistillSpec", "EpisodeSpec", "EvalSetSpec", "LossSpec",
    "PolicySourcesSpec", "RejectionSFTSpec", "RolloutSpec", "RunSpec", "SFTSpec",
    "ScheduleSpec", "ShapingSpec", "Specs", "TokenWeightSpec", "build_specs", "distill_spec",
    "loss_spec",
]


@dataclasses.dataclass(frozen=True, kw_only=True)
class ShapingSpec(Shaping):
  """The `Shaping` concern plus the group size and the completion columns."""

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
  env_timeout: float | None    # None: no deadline
  env_reward_only: bool
  on_truncated_episode: tuple[tuple[str, str], ...]   # (status, keep | mask | drop)
  turn_rewards: bool
  gamma: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class RolloutSpec(Sampling):
  """The `Sampling` concern as the run resolves it: `max_new_tokens` is T, the completion
  columns; `eval_n`, `eval_temperature` and `eval_size` are the held-out set's."""

  dynamic_sampling: bool       # DAPO's dynamic sampling and its rounds (`Schedule`'s fields)
  dynamic_sampling_max_rounds: int
  greedy_baseline: bool = False   # also a greedy rollout per prompt (ReMax's baseline)
  episodes: EpisodeSpec | None = None
  eval_size: int = 0           # held-out prompts evaluated (0: all of task.heldout_size)

  def check(self, c):
    """None: the concern's own checks ran on the config's fields, not the resolved ones."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class DistillSpec(Distill):
  """The `Distill` concern with `distill_teacher`'s "{seed}" resolved, plus that seed (the
  one `distill_teacher_recipe` trains the teacher with)."""

  seed: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class ScheduleSpec(Schedule):
  """How a rollout batch is consumed: the `Schedule` concern plus the warm-ups."""

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


@dataclasses.dataclass(frozen=True, kw_only=True)
class AdvantageSpec(Advantages):
  """The `Advantages` concern plus what the estimate reads from elsewhere (a hashable jit
  argument)."""

  kwargs: tuple                # the estimator's own arguments, sorted (name, value) pairs
  group_size: int
  kl_in_reward: bool
  kl_estimator: str
  # GDPO (algo.reward_aggregation="normalize_then_sum"): weights of the reward components,
  # set once the run's reward is built; empty: the weighted sum is the score
  reward_weights: tuple = ()
  sampling_sum_sq: bool = False   # the estimator reads the sampling policy's Σ_v π_v² (OTB)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SFTSpec(SFT):
  """The `SFT` concern as the run resolves it (`max_len` is the demonstration length: the
  completion columns when `sft.max_len` is 0) plus its cache keys."""

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


def fill(spec_type, *concerns, **derived):
  """`spec_type` with each field from `derived`, else from the first concern that has it; a
  field found nowhere keeps its default."""
  values = {}
  for f in dataclasses.fields(spec_type):
    found = [getattr(c, f.name) for c in concerns if hasattr(c, f.name)]
    if f.name in derived or found:
      values[f.name] = derived[f.name] if f.name in derived else found[0]
  return spec_type(**values)


def build_specs(config, *, model_description: str, pack_groups: int = 0) -> Specs:
  """Every spec of a validated config.

  Args:
    model_description: the built model's config as text (part of the warm start's cache key).
    pack_groups: packed-forward groups per micro-batch (0: padded; from the mesh).
  """
  columns, sets = completion_columns(config), resolved_eval_sets(config)
  evals = {name: EvalSetSpec(name=name, **fields) for name, fields in sets.items()}
  a, n = config.algo, int(config.sampling.n)
  adv, rsft, sft = read(Advantages, config), read(RejectionSFTSpec, config), read(SFT, config)
  sources = read(PolicySourcesSpec, config)
  return Specs(
      run=read(RunSpec, config), rollout=_rollout_spec(config, columns, evals["heldout"]),
      shaping=fill(ShapingSpec, read(Shaping, config), group=n, max_len=columns),
      sources=sources, weights=read(TokenWeightSpec, config),
      schedule=fill(ScheduleSpec, read(Schedule, config), read(algo.Critic, config),
                    read(algo.LossTerms, config), rsft=rsft if rsft.rsft_every else None),
      loss=loss_spec(config, pack_groups, columns=columns),
      advantage=fill(AdvantageSpec, adv, sources, kwargs=estimator_kwargs(adv.advantage, a),
                     group_size=n, kl_in_reward=a.kl_placement == "reward",
                     sampling_sum_sq=adv.advantage == "optimal_token_baseline"),
      sft=fill(SFTSpec, sft, max_len=sft.max_len or columns,
               cache_key=_sft_cache_key(config, model_description, columns),
               heldout_key=_heldout_key(config, model_description, columns, sets)),
      distill=distill_spec(config),
      eval_sets=tuple(spec for name, spec in evals.items() if name != "heldout"))


def _rollout_spec(config, columns: int, heldout: EvalSetSpec) -> RolloutSpec:
  t, sampling, schedule = read(Task, config), read(Sampling, config), read(Schedule, config)
  episodes = None
  if t.env:
    e = read(algo.Episodes, config)
    episodes = fill(EpisodeSpec, t, sampling, e, read(Advantages, config),
                    env_timeout=t.env_timeout or None,
                    on_truncated_episode=tuple(sorted(e.on_truncated_episode.items())))
  return fill(RolloutSpec, sampling, schedule, max_new_tokens=columns,
              greedy_baseline=config.algo.advantage == "remax", eval_n=heldout.k,
              eval_temperature=heldout.temperature, episodes=episodes, eval_size=heldout.size)


def loss_spec(config, pack_groups: int = 0, *, columns: int | None = None) -> LossSpec:
  """The objective's spec; its policy loss comes from the registry's one builder
  (`rljax.ops.policy_loss.policy_loss_spec`), as the trick-impact analysis's does."""
  a, terms = config.algo, read(algo.LossTerms, config)
  decoupled = a.off_policy_correction == "decoupled"
  return fill(LossSpec, read(algo.Clipping, config), terms, read(algo.Critic, config),
              read(algo.MoE, config), read(PolicySourcesSpec, config), read(Sampling, config),
              policy=policy_loss_spec(a.policy_loss, a),
              max_len=completion_columns(config) if columns is None else columns,
              kl_in_loss=a.kl_placement == "loss", use_critic=a.advantage == "gae",
              old_logp_from_update=a.old_logp_source == "update",
              decoupled_cap=(terms.decoupled_cap or float("inf")) if decoupled else None,
              pack_groups=int(pack_groups), routing_replay=a.routing_replay == "sampler")


def distill_spec(config) -> DistillSpec | None:
  """On-policy distillation's spec; None without a teacher."""
  d = read(Distill, config)
  if not d.distill_teacher:
    return None
  return fill(DistillSpec, d, distill_teacher=distill_teacher_dir(config),
              seed=int(config.run.seed))


def _digest(parts) -> str:
  return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _sft_cache_key(config, model_description: str, columns: int) -> str:
  """Hash of everything the warm start depends on (not the RL fields), so every step of an
  ablation, and every run with the same seed, task and model, shares one warm start."""
  parts = {"model": model_description, "task": config.task.to_dict(),
           "sft": config.sft.to_dict(), "seed": config.run.seed, "max_new_tokens": columns}
  parts["sft"].pop("cache_dir", None)
  return _digest(parts)


def _heldout_key(config, model_description: str, columns: int, sets: dict) -> str:
  """Hash of everything the evaluation of the start depends on: the warm start, the task,
  the sampling and evaluation settings (the named sets of `eval.sets` when any differ from
  the base config), LoRA adapters (an unmerged adapter rounds differently) and the mesh;
  not the RL fields."""
  parts = {"start": _sft_cache_key(config, model_description, columns),
           "sampling": config.sampling.to_dict(), "parallel": config.parallel.to_dict(),
           "lora": [config.model.lora_rank, config.model.lora_alpha,
                    list(config.model.lora_targets)], "format": 1}
  if config.eval.to_dict() != base_config().eval.to_dict():   # named sets join the summary
    parts["eval"] = sets
  return _digest(parts)
