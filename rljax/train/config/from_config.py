"""`build_specs(config)`: the one place that turns a validated config into the specs.

Every spec is filled by one generic function, `fill`: a field takes the value the builder
derives for it (the completion columns, the resolved held-out set, the loss registry's
arguments), else the same-named field of the concerns it is built from
(`rljax.train.config.algo`, `groups`, `task`). Derived values are computed once, here, and
nothing is written back.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

from rljax.ops.estimators import ADVANTAGE_ESTIMATORS, estimator_kwargs
from rljax.ops.policy_loss import policy_loss_spec
from rljax.train.config import algo, groups, task
from rljax.train.config.defaults import (
    base_config,
    completion_columns,
    distill_teacher_dir,
    resolved_eval_sets,
)
from rljax.train.config.fields import read
from rljax.train.config.specs import (
    AdvantageSpec,
    DistillSpec,
    EpisodeSpec,
    EvalSetSpec,
    LossSpec,
    PolicySourcesSpec,
    RejectionSFTSpec,
    RolloutSpec,
    RunSpec,
    ScheduleSpec,
    SFTSpec,
    ShapingSpec,
    Specs,
    TokenWeightSpec,
)


def fill(spec_type, *concerns, prefix: str = "", **derived):
  """`spec_type` with each field from `derived`, else from the first concern that has it as
  `name` or `prefix + name`; a field found nowhere keeps its default."""
  values = {}
  for f in dataclasses.fields(spec_type):
    if f.name in derived:
      values[f.name] = derived[f.name]
      continue
    for concern in concerns:
      for name in (f.name, prefix + f.name):
        if hasattr(concern, name):
          values[f.name] = getattr(concern, name)
          break
      if f.name in values:
        break
  return spec_type(**values)


def run_spec(config) -> RunSpec:
  return read(RunSpec, config)


def episode_spec(config) -> EpisodeSpec | None:
  t = read(task.Task, config)
  if not t.env:
    return None
  episodes = read(algo.Episodes, config)
  return fill(EpisodeSpec, t, read(task.Sampling, config), episodes,
              read(algo.Advantages, config), timeout=t.env_timeout or None,
              reward_only=t.env_reward_only,
              on_truncated=tuple(sorted(episodes.on_truncated_episode.items())))


def rollout_spec(config) -> RolloutSpec:
  schedule, heldout = read(algo.Schedule, config), resolved_eval_sets(config)["heldout"]
  return fill(RolloutSpec, read(task.Sampling, config), schedule,
              max_new_tokens=completion_columns(config),
              max_rounds=schedule.dynamic_sampling_max_rounds if schedule.dynamic_sampling else 1,
              greedy_baseline=config.algo.advantage == "remax", eval_n=int(heldout["k"]),
              eval_temperature=float(heldout["temperature"]), episodes=episode_spec(config),
              eval_size=int(heldout["size"]))


def shaping_spec(config) -> ShapingSpec:
  return fill(ShapingSpec, read(algo.Shaping, config), group=int(config.sampling.n),
              max_len=completion_columns(config))


def sources_spec(config) -> PolicySourcesSpec:
  return read(PolicySourcesSpec, config)


def weights_spec(config) -> TokenWeightSpec:
  return read(TokenWeightSpec, config)


def schedule_spec(config) -> ScheduleSpec:
  rsft = read(algo.RejectionSFT, config)
  return fill(ScheduleSpec, read(algo.Schedule, config), read(algo.Critic, config),
              read(algo.LossTerms, config),
              rsft=fill(RejectionSFTSpec, rsft, prefix="rsft_") if rsft.rsft_every else None)


def loss_spec(config, pack_groups: int = 0) -> LossSpec:
  """The objective's spec; its policy loss comes from the registry's one builder
  (`rljax.ops.policy_loss.policy_loss_spec`), as the trick-impact analysis's does."""
  a, terms = config.algo, read(algo.LossTerms, config)
  decoupled = a.off_policy_correction == "decoupled"
  return fill(LossSpec, read(algo.Clipping, config), terms, read(algo.Critic, config),
              read(algo.MoE, config), read(PolicySourcesSpec, config),
              policy=policy_loss_spec(a.policy_loss, a), max_len=completion_columns(config),
              kl_in_loss=a.kl_placement == "loss", use_critic=a.advantage == "gae",
              temperature=float(config.sampling.temperature),
              old_logp_from_update=a.old_logp_source == "update",
              decoupled_cap=(terms.decoupled_cap or float("inf")) if decoupled else None,
              pack_groups=int(pack_groups), routing_replay=a.routing_replay == "sampler")


def advantage_spec(config) -> AdvantageSpec:
  adv = read(algo.Advantages, config)
  return fill(AdvantageSpec, adv, read(PolicySourcesSpec, config), estimator=adv.advantage,
              kwargs=estimator_kwargs(adv.advantage, config.algo),
              token_level=ADVANTAGE_ESTIMATORS[adv.advantage].level == "token",
              group_size=int(config.sampling.n), whiten=adv.whiten_advantages,
              kl_in_reward=config.algo.kl_placement == "reward", eps=adv.adv_eps)


def distill_spec(config) -> DistillSpec | None:
  """On-policy distillation's spec; None without a teacher."""
  d = read(algo.Distill, config)
  if not d.distill_teacher:
    return None
  return fill(DistillSpec, d, prefix="distill_", teacher=distill_teacher_dir(config),
              recipe=d.distill_teacher_recipe, seed=int(config.run.seed))


def eval_set_specs(config) -> tuple[EvalSetSpec, ...]:
  """The named evaluation sets besides `heldout`, in the config's order."""
  return tuple(EvalSetSpec(name=name, **f)
               for name, f in resolved_eval_sets(config).items() if name != "heldout")


def _digest(parts) -> str:
  return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def sft_cache_key(config, model_description: str) -> str:
  """Hash of everything the warm start depends on (not the RL fields), so every step of an
  ablation, and every run with the same seed, task and model, shares one warm start."""
  parts = {"model": model_description, "task": config.task.to_dict(),
           "sft": config.sft.to_dict(), "seed": config.run.seed,
           "max_new_tokens": completion_columns(config)}
  parts["sft"].pop("cache_dir", None)
  return _digest(parts)


def heldout_key(config, model_description: str) -> str:
  """Hash of everything the evaluation of the start depends on: the warm start, the task,
  the sampling and evaluation settings (the named sets of `eval.sets` when any differ from
  the base config), LoRA adapters (an unmerged adapter rounds differently) and the mesh;
  not the RL fields."""
  parts = {"start": sft_cache_key(config, model_description),
           "sampling": config.sampling.to_dict(), "parallel": config.parallel.to_dict(),
           "lora": [config.model.lora_rank, config.model.lora_alpha,
                    list(config.model.lora_targets)], "format": 1}
  if config.eval.to_dict() != base_config().eval.to_dict():   # named sets join the summary
    parts["eval"] = resolved_eval_sets(config)
  return _digest(parts)


def sft_spec(config, model_description: str) -> SFTSpec:
  sft = read(groups.SFT, config)
  return fill(SFTSpec, sft, completion_len=sft.max_len or completion_columns(config),
              cache_key=sft_cache_key(config, model_description),
              heldout_key=heldout_key(config, model_description))


def build_specs(config, *, model_description: str, pack_groups: int = 0) -> Specs:
  """Every spec of a validated config.

  Args:
    model_description: the built model's config as text (part of the warm start's cache key).
    pack_groups: packed-forward groups per micro-batch (0: padded; from the mesh).
  """
  return Specs(run=run_spec(config), rollout=rollout_spec(config),
               shaping=shaping_spec(config), sources=sources_spec(config),
               weights=weights_spec(config), schedule=schedule_spec(config),
               loss=loss_spec(config, pack_groups), advantage=advantage_spec(config),
               sft=sft_spec(config, model_description), distill=distill_spec(config),
               eval_sets=eval_set_specs(config))
