"""`build_specs(config)`: the one place that reads the ConfigDict for the runtime.

Each builder reads one concern's fields and returns its frozen spec
(`rljax.train.config.specs`); a derived value (the completion columns of a multi-turn run,
the warm start's cache key) is computed here once, and nothing is written back.
"""

from __future__ import annotations

import hashlib
import json

from rljax.ops.estimators import ADVANTAGE_ESTIMATORS, estimator_kwargs
from rljax.ops.policy_loss import policy_loss_spec
from rljax.train.config.defaults import (
    base_config,
    completion_columns,
    distill_teacher_dir,
    resolved_eval_sets,
)
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


def run_spec(config) -> RunSpec:
  r = config.run
  return RunSpec(dir=str(r.dir), seed=int(r.seed), sample_stream=int(r.sample_stream),
                 iterations=int(r.iterations),
                 save_every=int(r.save_every), keep_checkpoints=int(r.keep_checkpoints),
                 eval_every=int(r.eval_every), max_nonfinite_in_row=int(r.max_nonfinite_in_row),
                 progress=bool(r.progress), plots=bool(r.plots), tensorboard=bool(r.tensorboard))


def episode_spec(config) -> EpisodeSpec | None:
  t, s, a = config.task, config.sampling, config.algo
  if not t.env:
    return None
  return EpisodeSpec(
      env=str(t.env), max_turns=int(s.max_turns), turn_stop=tuple(s.turn_stop),
      max_observation_tokens=int(s.max_observation_tokens),
      timeout=float(t.env_timeout) or None, reward_only=bool(t.env_reward_only),
      on_truncated=tuple(sorted(a.on_truncated_episode.items())),
      turn_rewards=bool(a.turn_rewards), gamma=float(a.gamma))


def rollout_spec(config) -> RolloutSpec:
  s, a = config.sampling, config.algo
  heldout = resolved_eval_sets(config)["heldout"]
  return RolloutSpec(
      prompts_per_iteration=int(s.prompts_per_iteration), n=int(s.n),
      max_new_tokens=completion_columns(config), temperature=float(s.temperature),
      top_k=int(s.top_k), top_p=float(s.top_p), min_p=float(s.min_p),
      continuous=bool(s.continuous), slots=int(s.slots), share_prefill=bool(s.share_prefill),
      dynamic_sampling=bool(a.dynamic_sampling),
      max_rounds=int(a.dynamic_sampling_max_rounds) if a.dynamic_sampling else 1,
      greedy_baseline=a.advantage == "remax", eval_n=int(heldout["k"]),
      eval_temperature=float(heldout["temperature"]), eval_passk_n=int(s.eval_passk_n),
      eval_passk_prompts=int(s.eval_passk_prompts), max_staleness=int(s.max_staleness),
      partial_rollouts=bool(s.partial_rollouts),
      episodes=episode_spec(config), eval_size=int(heldout["size"]),
      sampler_dtype=str(s.sampler_dtype))


def shaping_spec(config) -> ShapingSpec:
  a = config.algo
  return ShapingSpec(
      group=int(config.sampling.n), max_len=completion_columns(config),
      missing_eos_penalty=float(a.missing_eos_penalty),
      repetition_penalty=float(a.repetition_penalty), repetition_ngram=int(a.repetition_ngram),
      soft_overlong=bool(a.soft_overlong), overlong_cache_len=int(a.overlong_cache_len),
      length_penalty=float(a.length_penalty), reward_norm=bool(a.reward_norm),
      reward_clip=float(a.reward_clip))


def sources_spec(config) -> PolicySourcesSpec:
  a = config.algo
  return PolicySourcesSpec(
      old_logp_source=a.old_logp_source, off_policy_correction=a.off_policy_correction,
      is_correction=a.is_correction, is_level=a.is_level,
      tis_cap=float(a.tis_cap), icepop_low=float(a.icepop_low),
      icepop_high=float(a.icepop_high), kl_placement=a.kl_placement,
      kl_estimator=a.kl_estimator, kl_coef=float(a.kl_coef), kl_controller=a.kl_controller,
      kl_target=float(a.kl_target), kl_horizon=int(a.kl_horizon),
      reference_offload=bool(a.reference_offload), ref_refresh=a.ref_refresh,
      ref_refresh_every=int(a.ref_refresh_every), ref_mix_alpha=float(a.ref_mix_alpha),
      ref_reset_optimizer=bool(a.ref_reset_optimizer))


def weights_spec(config) -> TokenWeightSpec:
  a = config.algo
  return TokenWeightSpec(
      psr_weight=float(a.psr_weight), nsr_weight=float(a.nsr_weight),
      high_entropy_fraction=float(a.high_entropy_fraction),
      overlong_filter=bool(a.overlong_filter), pf_ppo=a.pf_ppo,
      pf_ppo_power=float(a.pf_ppo_power))


def schedule_spec(config) -> ScheduleSpec:
  a = config.algo
  rsft = None
  if a.rsft_every:
    rsft = RejectionSFTSpec(every=int(a.rsft_every), k=int(a.rsft_k),
                            prompts=int(a.rsft_prompts), steps=int(a.rsft_steps),
                            lr=float(a.rsft_lr), min_score=a.rsft_min_score,
                            from_teacher=bool(a.rsft_from_teacher))
  return ScheduleSpec(epochs=int(a.epochs), minibatches=int(a.minibatches),
                      microbatches=int(a.microbatches),
                      critic_warmup_iterations=int(a.critic_warmup_iterations),
                      ptx_coef=float(a.ptx_coef), rsft=rsft)


def loss_spec(config, pack_groups: int = 0) -> LossSpec:
  """The objective's spec; its policy loss comes from the registry's one builder
  (`rljax.ops.policy_loss.policy_loss_spec`), as the trick-impact analysis's does."""
  a = config.algo
  return LossSpec(
      policy=policy_loss_spec(a.policy_loss, a), loss_agg=a.loss_agg,
      max_len=completion_columns(config), kl_in_loss=a.kl_placement == "loss",
      kl_estimator=a.kl_estimator, kl_is_correction=bool(a.kl_is_correction),
      entropy_coef=float(a.entropy_coef), use_critic=a.advantage == "gae",
      value_clip=float(a.value_clip), vf_coef=float(a.vf_coef), ptx_coef=float(a.ptx_coef),
      pg_coef=float(a.pg_coef), temperature=float(config.sampling.temperature),
      old_logp_from_update=a.old_logp_source == "update",
      decoupled_cap=(float(a.decoupled_cap) or float("inf"))
      if a.off_policy_correction == "decoupled" else None, pack_groups=int(pack_groups),
      routing_replay=a.routing_replay == "sampler",
      moe_aux_loss_coef=float(a.moe_aux_loss_coef), moe_z_loss_coef=float(a.moe_z_loss_coef))


def advantage_spec(config) -> AdvantageSpec:
  a = config.algo
  return AdvantageSpec(
      estimator=a.advantage, kwargs=estimator_kwargs(a.advantage, a),
      token_level=ADVANTAGE_ESTIMATORS[a.advantage].level == "token", group_size=int(config.sampling.n), gamma=float(a.gamma), lam=float(a.lam),
      whiten=bool(a.whiten_advantages), kl_in_reward=a.kl_placement == "reward",
      kl_estimator=a.kl_estimator, eps=float(a.adv_eps),
      gdpo_whiten_over=a.gdpo_whiten_over)


def distill_spec(config) -> DistillSpec | None:
  """On-policy distillation's spec; None without a teacher."""
  a = config.algo
  if not a.distill_teacher:
    return None
  return DistillSpec(teacher=distill_teacher_dir(config), recipe=str(a.distill_teacher_recipe),
                     seed=int(config.run.seed), coef=float(a.distill_coef),
                     mode=str(a.distill_mode), only=bool(a.distill_only),
                     teacher_dtype=str(a.distill_teacher_dtype))


def eval_set_specs(config) -> tuple[EvalSetSpec, ...]:
  """The named evaluation sets besides `heldout`, in the config's order."""
  return tuple(EvalSetSpec(name=name, source=str(f["source"]), size=int(f["size"]),
                           greedy=bool(f["greedy"]), temperature=float(f["temperature"]),
                           k=int(f["k"]))
               for name, f in resolved_eval_sets(config).items() if name != "heldout")


def sft_cache_key(config, model_description: str) -> str:
  """Hash of everything the warm start depends on (not the RL fields), so every step of an
  ablation, and every run with the same seed, task and model, shares one warm start."""
  parts = {"model": model_description, "task": config.task.to_dict(),
           "sft": config.sft.to_dict(), "seed": config.run.seed,
           "max_new_tokens": completion_columns(config)}
  parts["sft"].pop("cache_dir", None)
  return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


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
  return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def sft_spec(config, model_description: str) -> SFTSpec:
  f = config.sft
  return SFTSpec(steps=int(f.steps), batch_size=int(f.batch_size), lr=float(f.lr),
                 warmup_steps=int(f.warmup_steps), end_lr_fraction=float(f.end_lr_fraction),
                 worked_steps=int(f.worked_steps),
                 completion_len=int(f.max_len) or completion_columns(config),
                 cache_dir=str(f.cache_dir), cache_key=sft_cache_key(config, model_description),
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
