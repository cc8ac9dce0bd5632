"""`build_specs(config)`: the one place that turns a validated config into the specs.

Every spec is filled by one generic function, `fill`: a field takes the value the builder
derives for it, else the same-named field of the concerns it is built from
(`rljax.train.config.algo`, `groups`, `task`). The derived values (the completion columns,
the resolved evaluation sets, the teacher's directory, the cache keys) are computed once,
here, and nothing is written back.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

from rljax.ops.estimators import estimator_kwargs
from rljax.ops.policy_loss import policy_loss_spec
from rljax.train.config import algo, specs
from rljax.train.config.defaults import (
    base_config,
    completion_columns,
    distill_teacher_dir,
    resolved_eval_sets,
)
from rljax.train.config.fields import read
from rljax.train.config.groups import SFT, EvalSetSpec, RunSpec
from rljax.train.config.task import Sampling, Task


def fill(spec_type, *concerns, prefix: str = "", **derived):
  """`spec_type` with each field from `derived`, else from the first concern that has it as
  `name` or `prefix + name`; a field found nowhere keeps its default."""
  values = {}
  for f in dataclasses.fields(spec_type):
    names = (f.name, prefix + f.name)
    found = [getattr(c, n) for c in concerns for n in names if hasattr(c, n)]
    if f.name in derived or found:
      values[f.name] = derived[f.name] if f.name in derived else found[0]
  return spec_type(**values)


def build_specs(config, *, model_description: str, pack_groups: int = 0) -> specs.Specs:
  """Every spec of a validated config.

  Args:
    model_description: the built model's config as text (part of the warm start's cache key).
    pack_groups: packed-forward groups per micro-batch (0: padded; from the mesh).
  """
  columns, sets = completion_columns(config), resolved_eval_sets(config)
  a, n = config.algo, int(config.sampling.n)
  adv, schedule = read(algo.Advantages, config), read(algo.Schedule, config)
  rsft, sft = read(algo.RejectionSFT, config), read(SFT, config)
  return specs.Specs(
      run=read(RunSpec, config), rollout=_rollout_spec(config, columns, sets["heldout"]),
      shaping=fill(specs.ShapingSpec, read(algo.Shaping, config), group=n, max_len=columns),
      sources=sources_spec(config), weights=read(specs.TokenWeightSpec, config),
      schedule=fill(specs.ScheduleSpec, schedule, read(algo.Critic, config),
                    read(algo.LossTerms, config), rsft=fill(
                        specs.RejectionSFTSpec, rsft, prefix="rsft_") if rsft.rsft_every else None),
      loss=loss_spec(config, pack_groups, columns=columns),
      advantage=fill(specs.AdvantageSpec, adv, read(specs.PolicySourcesSpec, config),
                     estimator=adv.advantage, kwargs=estimator_kwargs(adv.advantage, a),
                     group_size=n, whiten=adv.whiten_advantages, eps=adv.adv_eps,
                     kl_in_reward=a.kl_placement == "reward",
                     sampling_sum_sq=adv.advantage == "optimal_token_baseline"),
      sft=fill(specs.SFTSpec, sft, completion_len=sft.max_len or columns,
               cache_key=_sft_cache_key(config, model_description, columns),
               heldout_key=_heldout_key(config, model_description, columns, sets)),
      distill=distill_spec(config),
      eval_sets=tuple(EvalSetSpec(name=k, **f) for k, f in sets.items() if k != "heldout"))


def _rollout_spec(config, columns: int, heldout: dict) -> specs.RolloutSpec:
  t, sampling, schedule = read(Task, config), read(Sampling, config), read(algo.Schedule, config)
  episodes = None
  if t.env:
    e = read(algo.Episodes, config)
    episodes = fill(specs.EpisodeSpec, t, sampling, e, read(algo.Advantages, config),
                    timeout=t.env_timeout or None, reward_only=t.env_reward_only,
                    on_truncated=tuple(sorted(e.on_truncated_episode.items())))
  return fill(specs.RolloutSpec, sampling, schedule, max_new_tokens=columns,
              max_rounds=schedule.dynamic_sampling_max_rounds if schedule.dynamic_sampling else 1,
              greedy_baseline=config.algo.advantage == "remax", eval_n=int(heldout["k"]),
              eval_temperature=float(heldout["temperature"]), episodes=episodes,
              eval_size=int(heldout["size"]))


def sources_spec(config) -> specs.PolicySourcesSpec:
  return read(specs.PolicySourcesSpec, config)


def loss_spec(config, pack_groups: int = 0, *, columns: int | None = None) -> specs.LossSpec:
  """The objective's spec; its policy loss comes from the registry's one builder
  (`rljax.ops.policy_loss.policy_loss_spec`), as the trick-impact analysis's does."""
  a, terms = config.algo, read(algo.LossTerms, config)
  decoupled = a.off_policy_correction == "decoupled"
  return fill(specs.LossSpec, read(algo.Clipping, config), terms, read(algo.Critic, config),
              read(algo.MoE, config), read(specs.PolicySourcesSpec, config),
              policy=policy_loss_spec(a.policy_loss, a),
              max_len=completion_columns(config) if columns is None else columns,
              kl_in_loss=a.kl_placement == "loss", use_critic=a.advantage == "gae",
              temperature=float(config.sampling.temperature),
              old_logp_from_update=a.old_logp_source == "update",
              decoupled_cap=(terms.decoupled_cap or float("inf")) if decoupled else None,
              pack_groups=int(pack_groups), routing_replay=a.routing_replay == "sampler")


def distill_spec(config) -> specs.DistillSpec | None:
  """On-policy distillation's spec; None without a teacher."""
  d = read(algo.Distill, config)
  if not d.distill_teacher:
    return None
  return fill(specs.DistillSpec, d, prefix="distill_", teacher=distill_teacher_dir(config),
              recipe=d.distill_teacher_recipe, seed=int(config.run.seed))


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
