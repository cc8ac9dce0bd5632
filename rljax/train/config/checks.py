"""Checks of fields that are valid alone but not together, one function per feature
(called by `rljax.train.config.validation`, which collects every message)."""

from __future__ import annotations

import re

from rljax.data.records_task import ANSWER_EXTRACTORS
from rljax.data.tasks import TASKS
from rljax.models.hf import config_from_hf
from rljax.models.lora import TARGETS as LORA_TARGETS
from rljax.models.presets import hf_config_dict
from rljax.ops.estimators import ADVANTAGE_ESTIMATORS
from rljax.ops.policy_loss import POLICY_LOSSES
from rljax.train.config.checks_moe import check_moe, check_sampler_dtype
from rljax.train.config.checks_rollout import check_async, check_env
from rljax.train.config.defaults import completion_columns


def _check(errors, ok, message):
  if not ok:
    errors.append(message)


def check_combinations(errors, c):
  """Fields that are valid alone but not together (every feature's own checks)."""
  for check in (_check_advantages_and_rewards, _check_batch_split, _check_task, _check_data_source,
                _check_rsft, _check_policy_loss_and_reference, _check_user_rewards, _check_lora,
                check_env, _check_old_logp_from_update, check_async, _check_model_source,
                check_moe, check_sampler_dtype):
    check(errors, c)


def _check_advantages_and_rewards(errors, c):
  """The estimator's group size, KL to a reference, dynamic sampling, overlong shaping,
  what trains the policy."""
  a, s = c.algo, c.sampling
  estimator = ADVANTAGE_ESTIMATORS.get(a.advantage)
  if s.n < 2 and estimator is not None and estimator.group:
    errors.append(f"sampling.n={s.n}: algo.advantage={a.advantage!r} compares samples within a "
                  "group and needs sampling.n >= 2")
  if a.advantage == "pass_at_k" and not 1 <= a.pass_k <= s.n:
    errors.append(f"algo.pass_k={a.pass_k} must be in [1, sampling.n={s.n}]")
  if a.kl_placement != "none" and a.kl_coef == 0 and a.kl_controller == "fixed":
    errors.append("algo.kl_coef=0 with algo.kl_placement="
                  f"{a.kl_placement!r}: set a coefficient or kl_placement='none'")
  if a.reference_offload and a.kl_placement == "none":
    errors.append("algo.reference_offload=True but algo.kl_placement='none': there is no "
                  "reference model to offload")
  if a.dynamic_sampling and a.dynamic_sampling_max_rounds < 1:
    errors.append(f"algo.dynamic_sampling_max_rounds={a.dynamic_sampling_max_rounds}: dynamic "
                  "sampling needs at least 1 generation round")
  if a.soft_overlong and not 0 < a.overlong_cache_len < completion_columns(c):
    errors.append(f"algo.overlong_cache_len={a.overlong_cache_len} must be in "
                  f"(0, sampling.max_new_tokens={completion_columns(c)})")
  if a.pg_coef < 0:
    errors.append(f"algo.pg_coef={a.pg_coef} must be >= 0")
  elif a.pg_coef == 0 and not (a.ptx_coef or a.rsft_every or a.entropy_coef):
    errors.append("algo.pg_coef=0 leaves nothing to train the policy: set algo.ptx_coef "
                  "(continued SFT) or algo.rsft_every (rejection-sampled SFT)")
  if a.critic_warmup_iterations > 0 and a.advantage != "gae":
    errors.append("algo.critic_warmup_iterations > 0 needs a critic (algo.advantage='gae')")


def _check_batch_split(errors, c):
  """Epochs, minibatches and micro-batches divide the rollout batch."""
  a, s = c.algo, c.sampling
  batch = s.prompts_per_iteration * s.n
  for name in ("minibatches", "microbatches", "epochs"):
    if a[name] < 1:
      errors.append(f"algo.{name}={a[name]} must be >= 1")
  if a.minibatches < 1 or a.microbatches < 1 or batch < 1:
    return
  if batch % a.minibatches:
    errors.append(f"algo.minibatches={a.minibatches} must divide the rollout batch "
                  f"prompts_per_iteration*n={batch}")
  elif (batch // a.minibatches) % a.microbatches:
    errors.append(f"algo.microbatches={a.microbatches} must divide the minibatch size "
                  f"{batch // a.minibatches}")


def _check_task(errors, c):
  """The out-of-distribution split, chat templates, the JSONL path."""
  t = c.task
  if t.ood_difficulty and t.name not in TASKS:
    errors.append(f"task.ood_difficulty={t.ood_difficulty} needs a synthetic task "
                  f"({sorted(TASKS)}), not task.name={t.name!r}")
  if t.ood_difficulty < 0:
    errors.append(f"task.ood_difficulty={t.ood_difficulty} must be >= 0 (0: off)")
  if t.chat_template and not c.model.hf_path:
    errors.append("task.chat_template=True needs a Hugging Face tokenizer (model.hf_path)")
  if t.name == "jsonl" and not t.jsonl_path:
    errors.append("task.jsonl_path is empty but task.name='jsonl'")


def _check_policy_loss_and_reference(errors, c):
  """The chosen policy loss's own fields (its registry entry's check), the KL corrections,
  reference refresh and PF-PPO."""
  a = c.algo
  if a.policy_loss in POLICY_LOSSES:
    errors.extend(POLICY_LOSSES[a.policy_loss].check(a))
  if a.kl_is_correction and a.kl_placement != "loss":
    errors.append("algo.kl_is_correction=True corrects the KL term of the loss: it needs "
                  f"algo.kl_placement='loss' (got {a.kl_placement!r})")
  if a.ref_refresh != "none":
    if a.kl_placement == "none":
      errors.append(f"algo.ref_refresh={a.ref_refresh!r} but algo.kl_placement='none': there "
                    "is no reference model to refresh")
    if not isinstance(a.ref_refresh_every, int) or a.ref_refresh_every < 1:
      errors.append(f"algo.ref_refresh_every={a.ref_refresh_every!r} must be an int >= 1 when "
                    f"algo.ref_refresh={a.ref_refresh!r}")
  if not 0.0 <= a.ref_mix_alpha <= 1.0:
    errors.append(f"algo.ref_mix_alpha={a.ref_mix_alpha} must be in [0, 1]")
  if a.ref_reset_optimizer and a.ref_refresh != "reset":
    errors.append("algo.ref_reset_optimizer=True needs algo.ref_refresh='reset'")
  if a.pf_ppo != "none" and a.old_logp_source == "update":
    errors.append("algo.pf_ppo resamples the batch before the update; it needs "
                  "algo.old_logp_source != 'update'")


def _check_user_rewards(errors, c):
  """task.reward_fns / reward_weights / python, reward aggregation and the shaping penalties."""
  t, a = c.task, c.algo
  fns, weights = list(t.reward_fns), list(t.reward_weights)
  if any(not isinstance(f, str) or ":" not in f for f in fns):
    errors.append(f"task.reward_fns={fns!r}: each entry is 'module.path:fn' or 'file.py:fn'")
  if weights and len(weights) != len(fns):
    errors.append(f"task.reward_weights has {len(weights)} entries for {len(fns)} "
                  "task.reward_fns (or leave it empty for 1.0 each)")
  if any(not isinstance(w, int | float) for w in weights):
    errors.append(f"task.reward_weights={weights!r} must be numbers")
  if (t.name == "python") != bool(t.python):
    errors.append(f"task.python={t.python!r} is the task factory of task.name='python' "
                  f"(got task.name={t.name!r}): set both or neither")
  if a.reward_aggregation == "normalize_then_sum":
    if a.advantage != "grpo":
      errors.append("algo.reward_aggregation='normalize_then_sum' (GDPO) replaces GRPO's group "
                    f"normalisation: it needs algo.advantage='grpo' (got {a.advantage!r})")
    if a.reward_norm or a.reward_clip:
      errors.append("algo.reward_aggregation='normalize_then_sum' normalises each reward "
                    "itself: set algo.reward_norm=False and algo.reward_clip=0")
    if a.kl_placement == "reward":
      errors.append("algo.reward_aggregation='normalize_then_sum' has no place for a KL "
                    "penalty in the reward: use algo.kl_placement='loss' or 'none'")
  _check(errors, a.missing_eos_penalty >= 0,
         f"algo.missing_eos_penalty={a.missing_eos_penalty} must be >= 0")
  _check(errors, a.repetition_penalty >= 0,
         f"algo.repetition_penalty={a.repetition_penalty} must be >= 0 (0: off)")
  _check(errors, isinstance(a.repetition_ngram, int) and a.repetition_ngram >= 1,
         f"algo.repetition_ngram={a.repetition_ngram!r} must be an int >= 1")


def _check_lora(errors, c):
  """model.lora_*: rank, alpha, targets, and what LoRA runs do not combine with."""
  m, a = c.model, c.algo
  if not isinstance(m.lora_rank, int) or m.lora_rank < 0:
    errors.append(f"model.lora_rank={m.lora_rank!r} must be an int >= 0 (0: full fine-tuning)")
    return
  if m.lora_rank == 0:
    return
  _check(errors, m.lora_alpha > 0, f"model.lora_alpha={m.lora_alpha} must be > 0")
  targets = tuple(m.lora_targets)
  if not targets or any(t not in LORA_TARGETS for t in targets) or len(set(targets)) != len(targets):
    errors.append(f"model.lora_targets={targets!r}: each must be one of {list(LORA_TARGETS)}, "
                  "at least one, no repeats")
  for bad, why in ((a.ref_refresh != "none", f"algo.ref_refresh={a.ref_refresh!r}"),
                   (a.rsft_every > 0, f"algo.rsft_every={a.rsft_every}"),
                   (a.reference_offload, "algo.reference_offload=True")):
    if bad:
      errors.append(f"{why} is not supported with model.lora_rank > 0: the reference of a "
                    "LoRA run is the base with the adapters off (no copy to refresh or "
                    "offload), and rejection-sampling phases train full weights")


def _check_old_logp_from_update(errors, c):
  """old_logp_source='update' is exact only when nothing needs old log-probs before the step."""
  a = c.algo
  if a.old_logp_source != "update":
    return
  blockers = [(a.epochs * a.minibatches != 1, f"algo.epochs={a.epochs} x algo.minibatches="
               f"{a.minibatches} updates per rollout (needs exactly 1)"),
              (a.kl_placement == "reward", "algo.kl_placement='reward'"),
              (a.high_entropy_fraction > 0, "algo.high_entropy_fraction > 0"),
              (a.is_correction != "none", f"algo.is_correction={a.is_correction!r}")]
  for blocked, what in blockers:
    if blocked:
      errors.append(f"algo.old_logp_source='update' reads the old log-probs from the update "
                    f"step's own forward pass, which {what} rules out; use 'recompute'")


def _check_data_source(errors, c):
  """Fields of the jsonl / hf_dataset / tfds prompt sources."""
  t = c.task
  for name, field in (("hf_dataset", "hf_path"), ("tfds", "tfds_name")):
    if t.name == name and not t[field]:
      errors.append(f"task.{field} is empty but task.name={name!r}")
  if t.answer_extractor not in ANSWER_EXTRACTORS:
    errors.append(f"task.answer_extractor={t.answer_extractor!r} is not one of "
                  f"{list(ANSWER_EXTRACTORS)}")
  if t.answer_extractor == "regex":
    try:
      groups = re.compile(t.answer_regex).groups if t.answer_regex else 0
      _check(errors, groups >= 1, f"task.answer_regex={t.answer_regex!r} needs a capture "
             "group (task.answer_extractor='regex')")
    except re.error as e:
      errors.append(f"task.answer_regex={t.answer_regex!r} does not compile: {e}")
  if t.prompt_template and "{prompt}" not in t.prompt_template:
    errors.append(f"task.prompt_template={t.prompt_template!r} must contain '{{prompt}}'")


def _check_rsft(errors, c):
  """Rejection-sampling fine-tuning fields (rljax.train.run.rejection_sft)."""
  a = c.algo
  if not isinstance(a.rsft_every, int) or a.rsft_every < 0:
    errors.append(f"algo.rsft_every={a.rsft_every!r} must be an int >= 0 (0: off)")
    return
  if a.rsft_every == 0:
    return
  for name in ("rsft_k", "rsft_prompts", "rsft_steps"):
    if not isinstance(a[name], int) or a[name] < 1:
      errors.append(f"algo.{name}={a[name]!r} must be an int >= 1 when algo.rsft_every > 0")
  if not a.rsft_lr > 0:
    errors.append(f"algo.rsft_lr={a.rsft_lr} must be > 0")
  if a.rsft_min_score is not None and not isinstance(a.rsft_min_score, (int, float)):
    errors.append(f"algo.rsft_min_score={a.rsft_min_score!r} must be None or a number")




def _check_model_source(errors, c):
  """model.hf_path / model.hf_config (one source of the architecture, a readable one) and
  plan.prompt_len."""
  m = c.model
  if m.hf_path and m.hf_config:
    errors.append(f"model.hf_path={m.hf_path!r} and model.hf_config={m.hf_config!r} are both "
                  "set: hf_path loads a checkpoint (with its own config.json), hf_config builds "
                  "random weights of a preset's or a config.json's shapes; set one")
  elif m.hf_config:
    try:
      config_from_hf(hf_config_dict(m.hf_config))
    except ValueError as e:
      errors.append(f"model.hf_config={m.hf_config!r}: {e}")
  prompt_len = c.plan.prompt_len
  _check(errors, isinstance(prompt_len, int) and prompt_len >= 0,
         f"plan.prompt_len={prompt_len!r} must be an int >= 0 (0: the task's prompt columns)")
