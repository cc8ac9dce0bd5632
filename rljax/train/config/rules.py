"""The rules that span concerns: fields that are valid alone but not together.

Each rule reads the config (and its completion columns, derived once by `validate`) and
yields `(broken, message)` pairs; `rljax.train.config.loading.validate` collects the
messages of the broken ones. A field's own checks live with its concern.
"""

from __future__ import annotations

import pathlib

import jax

from rljax.ops import advantages_group
from rljax.ops.estimators import ADVANTAGE_ESTIMATORS
from rljax.ops.policy_loss import POLICY_LOSSES
from rljax.train.config.defaults import distill_teacher_dir, policy_experts


def objective(c, columns):
  """What the estimator, the loss terms and the critic need from each other and the batch."""
  a, s = c.algo, c.sampling
  estimator = ADVANTAGE_ESTIMATORS.get(a.advantage)
  yield (s.n < 2 and estimator is not None and estimator.group,
         f"sampling.n={s.n}: algo.advantage={a.advantage!r} compares samples within a group "
         "and needs sampling.n >= 2")
  yield (a.advantage == "pass_at_k" and not 1 <= a.pass_k <= s.n,
         f"algo.pass_k={a.pass_k} must be in [1, sampling.n={s.n}]")
  yield (a.soft_overlong and not 0 < a.overlong_cache_len < columns,
         f"algo.overlong_cache_len={a.overlong_cache_len} must be in "
         f"(0, sampling.max_new_tokens={columns})")
  yield (a.pg_coef == 0 and not (a.ptx_coef or a.rsft_every or a.entropy_coef),
         "algo.pg_coef=0 leaves nothing to train the policy: set algo.ptx_coef (continued "
         "SFT) or algo.rsft_every (rejection-sampled SFT)")
  yield (a.critic_warmup_iterations > 0 and a.advantage != "gae",
         "algo.critic_warmup_iterations > 0 needs a critic (algo.advantage='gae')")
  yield (a.gpg_f_norm <= 0, f"algo.gpg_f_norm={a.gpg_f_norm} must be > 0")
  yield (a.gpg_alpha not in advantages_group.GPG_ALPHA,
         f"algo.gpg_alpha={a.gpg_alpha!r} is not one of {list(advantages_group.GPG_ALPHA)}")
  if a.policy_loss in POLICY_LOSSES:   # the chosen loss's own fields (its registry check)
    yield from ((True, message) for message in POLICY_LOSSES[a.policy_loss].check(a))
  yield (a.kl_is_correction and a.kl_placement != "loss", "algo.kl_is_correction=True "
         "corrects the KL term of the loss: it needs algo.kl_placement='loss' (got "
         f"{a.kl_placement!r})")
  batch = s.prompts_per_iteration * s.n
  if min(a.minibatches, a.microbatches, batch) >= 1:
    yield (batch % a.minibatches, f"algo.minibatches={a.minibatches} must divide the rollout "
           f"batch prompts_per_iteration*n={batch}")
    yield (not batch % a.minibatches and (batch // a.minibatches) % a.microbatches,
           f"algo.microbatches={a.microbatches} must divide the minibatch size "
           f"{batch // a.minibatches}")


def rewards(c, columns):
  """GDPO's normalised rewards and what they leave no place for; the chat template."""
  a, gdpo = c.algo, c.algo.reward_aggregation == "normalize_then_sum"
  yield (gdpo and a.advantage != "grpo", "algo.reward_aggregation='normalize_then_sum' (GDPO) "
         "replaces GRPO's group normalisation: it needs algo.advantage='grpo' (got "
         f"{a.advantage!r})")
  yield (gdpo and (a.reward_norm or a.reward_clip), "algo.reward_aggregation="
         "'normalize_then_sum' normalises each reward itself: set algo.reward_norm=False and "
         "algo.reward_clip=0")
  yield (gdpo and a.kl_placement == "reward", "algo.reward_aggregation='normalize_then_sum' "
         "has no place for a KL penalty in the reward: use algo.kl_placement='loss' or 'none'")
  yield (c.task.chat_template and not c.model.hf_path,
         "task.chat_template=True needs a Hugging Face tokenizer (model.hf_path)")


def old_logps(c, columns):
  """old_logp_source='update' is exact only when nothing needs old log-probs before the step."""
  a = c.algo
  if a.old_logp_source != "update":
    return
  for blocked, what in (
      (a.epochs * a.minibatches != 1, f"algo.epochs={a.epochs} x algo.minibatches="
       f"{a.minibatches} updates per rollout (needs exactly 1)"),
      (a.kl_placement == "reward", "algo.kl_placement='reward'"),
      (a.high_entropy_fraction > 0, "algo.high_entropy_fraction > 0"),
      (a.is_correction != "none", f"algo.is_correction={a.is_correction!r}")):
    yield (blocked, "algo.old_logp_source='update' reads the old log-probs from the update "
           f"step's own forward pass, which {what} rules out; use 'recompute'")
  yield (a.pf_ppo != "none", "algo.pf_ppo resamples the batch before the update; it needs "
         "algo.old_logp_source != 'update'")
  yield (bool(a.distill_teacher), "algo.distill_teacher compares the teacher with the "
         "student's old log-probs before the update: it needs algo.old_logp_source != 'update'")


def lora(c, columns):
  """What LoRA runs do not combine with, and the sampler's cast copy."""
  m, a = c.model, c.algo
  yield (bool(c.sampling.sampler_dtype and m.lora_rank), f"sampling.sampler_dtype="
         f"{c.sampling.sampler_dtype!r} casts a plain decoder: it does not support LoRA "
         "adapters (model.lora_rank > 0)")
  if not (isinstance(m.lora_rank, int) and m.lora_rank > 0):
    return
  for bad, why in ((a.ref_refresh != "none", f"algo.ref_refresh={a.ref_refresh!r}"),
                   (a.rsft_every > 0, f"algo.rsft_every={a.rsft_every}"),
                   (a.reference_offload, "algo.reference_offload=True")):
    yield (bad, f"{why} is not supported with model.lora_rank > 0: the reference of a LoRA "
           "run is the base with the adapters off (no copy to refresh or offload), and "
           "rejection-sampling phases train full weights")


def episodes(c, columns):
  """task.env and the multi-turn sampling fields."""
  t, s, a, env = c.task, c.sampling, c.algo, bool(c.task.env)
  yield (a.turn_rewards and (not env or a.advantage != "grpo"), "algo.turn_rewards=True puts "
         "each turn's reward on its own tokens: it needs task.env and algo.advantage='grpo' "
         f"(got {t.env!r}, {a.advantage!r})")
  yield (not env and s.max_total_tokens, "sampling.max_total_tokens is a multi-turn episode's "
         "budget: it needs task.env (single-turn runs use sampling.max_new_tokens)")
  yield (not env and (s.max_turns > 1 or list(s.turn_stop)), "sampling.max_turns / "
         "sampling.turn_stop need task.env (an environment that answers each turn)")
  if not env:
    return
  yield (not list(s.turn_stop) and s.max_turns > 1, "task.env with sampling.max_turns > 1 "
         "needs sampling.turn_stop (the strings that end a turn, e.g. ['</call>'])")
  yield (a.dynamic_sampling,
         "algo.dynamic_sampling is not supported with task.env (multi-turn episodes)")
  yield (a.advantage == "remax", "algo.advantage='remax' (a greedy single-turn baseline) is "
         "not supported with task.env")
  yield (c.parallel.fsdp != 1 or c.parallel.tensor != 1, "task.env runs the episodes' rows "
         "data-parallel only: parallel.fsdp and parallel.tensor must be 1")
  yield (jax.process_count() > 1, f"task.env runs on one process (this run has "
         f"{jax.process_count()}): the environments step on the host that samples, and rows "
         "are not yet split over processes")


def stale_samples(c, columns):
  """Asynchronous rollouts (sampling.max_staleness), their corrections, partial rollouts."""
  s, a, k = c.sampling, c.algo, c.sampling.max_staleness
  off = a.off_policy_correction
  yield (off == "decoupled" and a.policy_loss != "ppo", "algo.off_policy_correction="
         "'decoupled' is AReaL's decoupled PPO clip: it needs algo.policy_loss='ppo' (got "
         f"{a.policy_loss!r})")
  yield (off == "decoupled" and a.ratio_cap, "algo.off_policy_correction='decoupled' has its "
         "own cap on the behaviour weight (algo.decoupled_cap): set algo.ratio_cap=0")
  if not isinstance(k, int):
    return
  for bad, what in ((bool(c.task.env), "task.env (multi-turn episodes)"),
                    # two threads issuing collectives cannot be ordered alike on every process
                    (jax.process_count() > 1, f"{jax.process_count()} processes"),
                    (a.rsft_every > 0, "algo.rsft_every (rejection-sampling phases)"),
                    (a.old_logp_source != "recompute",
                     f"algo.old_logp_source={a.old_logp_source!r}")):
    yield (k > 0 and bad, f"sampling.max_staleness={k} samples in the background: {what} is "
           "not supported with it (set sampling.max_staleness=0)")
  for bad, what in ((k == 0, "sampling.max_staleness=0 (no weight handoff happens "
                     "mid-request: set it >= 1)"),
                    (a.dynamic_sampling, "algo.dynamic_sampling (its extra rounds)"),
                    (a.advantage == "remax", "algo.advantage='remax' (its greedy rollout)"),
                    (s.max_new_tokens < k + 1,
                     f"sampling.max_new_tokens={s.max_new_tokens} < k + 1 = {k + 1} segments")):
    yield (s.partial_rollouts and bad,
           f"sampling.partial_rollouts=True is not supported with {what}")


def experts(c, columns):
  """Routing replay, the router's losses and an expert mesh axis need a mixture-of-experts
  policy; the expert axis splits its experts evenly."""
  a, size = c.algo, c.parallel.expert
  if size > 1:
    count = policy_experts(c)
    yield (not count, f"parallel.expert={size} splits a mixture-of-experts policy's experts; "
           "this policy is dense (model.num_experts = 0)")
    yield (count and count % size, f"parallel.expert={size} must divide the policy's {count} "
           "experts")
  routed = [f"algo.{n}={a[n]!r}" for n in ("moe_aux_loss_coef", "moe_z_loss_coef") if a[n] > 0]
  if a.routing_replay == "sampler":
    routed.insert(0, "algo.routing_replay='sampler'")
  if not routed:
    return
  yield (not policy_experts(c), f"{routed[0]} needs a mixture-of-experts policy "
         "(model.num_experts > 0, or a Qwen3-MoE / Qwen2-MoE model.hf_path / model.hf_config); "
         "this one is dense")
  yield (a.pack_sequences, f"{routed[0]} reads the routing of the padded forward: it needs "
         "algo.pack_sequences=False")
  yield (a.routing_replay == "sampler" and (c.task.env or c.sampling.partial_rollouts),
         "algo.routing_replay='sampler' replays the single-turn samplers' routes: multi-turn "
         "episodes (task.env) and sampling.partial_rollouts record none")


def teacher(c, columns):
  """On-policy distillation against the rewards and rejection-sampling phases; the
  teacher's directory exists, or a recipe will train it there."""
  a = c.algo
  yield (a.rsft_from_teacher and not a.distill_teacher,
         "algo.rsft_from_teacher=True needs a teacher: set algo.distill_teacher")
  if not a.distill_teacher:
    return
  yield (a.distill_mode == "reward" and a.reward_aggregation == "normalize_then_sum",
         "algo.distill_mode='reward' has no place in GDPO's normalised rewards "
         "(algo.reward_aggregation='normalize_then_sum'): use distill_mode='advantage'")
  yield (a.rsft_from_teacher and not a.rsft_every, "algo.rsft_from_teacher=True samples the "
         "RS-FT phases from the teacher: it needs algo.rsft_every > 0")
  yield (a.rsft_from_teacher and c.parallel.sampler_devices, "algo.rsft_from_teacher=True "
         "samples with the teacher on the trainer's devices: it needs parallel.sampler_devices=0")
  recipe = str(a.distill_teacher_recipe)
  if recipe:
    path = pathlib.Path(recipe.partition(":")[0])
    yield (path.suffix != ".py" or not path.is_file(), f"algo.distill_teacher_recipe="
           f"{recipe!r} is not an experiment file ('experiments/NAME.py[:step]')")
    return
  where = pathlib.Path(distill_teacher_dir(c))
  yield (not (where / "config.json").is_file(), f"algo.distill_teacher={a.distill_teacher!r}: "
         f"{str(where)!r} is neither an rljax run directory (config.json + checkpoints/) nor "
         "a Hugging Face directory (config.json + *.safetensors); set "
         "algo.distill_teacher_recipe to train it first")


RULES = (objective, rewards, old_logps, lora, episodes, stale_samples, experts, teacher)
