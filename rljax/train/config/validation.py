"""Config validation, once, before anything compiles.

Every problem is reported by field name with the allowed values; all problems are
collected and raised together as one `ConfigError`.
"""

from __future__ import annotations

import jax

from rljax.data.samplers import SAMPLERS
from rljax.data.tasks import TASKS
from rljax.models.config import ATTENTION_IMPLEMENTATIONS
from rljax.ops import advantages_group, mismatch
from rljax.ops.aggregate import AGGREGATION_MODES
from rljax.ops.estimators import ADVANTAGE_ESTIMATORS
from rljax.ops.kl import KL_ESTIMATORS
from rljax.ops.policy_loss import POLICY_LOSSES, RATIO_LEVELS
from rljax.parallel.mesh import select_devices
from rljax.train.config import checks
from rljax.train.config.checks_distill_eval import check_distill, check_eval_sets
from rljax.train.config.defaults import completion_columns, model_positions

PF_PPO_METHODS = ("none", *advantages_group.PF_PPO_METHODS)
REF_REFRESH_MODES = ("none", "mix", "reset")
KL_PLACEMENTS = ("none", "reward", "loss")
KL_CONTROLLERS = ("fixed", "adaptive")
IS_CORRECTIONS = ("none", "tis", "icepop")
OLD_LOGP_SOURCES = ("recompute", "sampler", "update")
OFF_POLICY_CORRECTIONS = ("none", "tis", "decoupled")
DTYPES = ("float32", "bfloat16", "float64")   # float64: with jax_enable_x64 (checked)
SAMPLER_DTYPES = ("", "float32", "bfloat16")
TASK_NAMES = (*TASKS, "jsonl", "hf_dataset", "tfds", "python")
REWARD_AGGREGATIONS = ("sum_then_normalize", "normalize_then_sum")


class ConfigError(ValueError):
  """A config has one or more invalid fields; the message names each one."""


def _choice(errors, config, dotted, allowed):
  value = _get(config, dotted)
  if value not in allowed:
    errors.append(f"{dotted}={value!r} is not one of {list(allowed)}")


def _get(config, dotted):
  node = config
  for part in dotted.split("."):
    node = node[part]
  return node


def _check(errors, ok, message):
  if not ok:
    errors.append(message)


def _check_choices(errors, c):
  for dotted, allowed in (
      ("algo.advantage", ADVANTAGE_ESTIMATORS), ("algo.policy_loss", POLICY_LOSSES),
      ("algo.ratio_level", RATIO_LEVELS), ("algo.loss_agg", AGGREGATION_MODES),
      ("algo.kl_placement", KL_PLACEMENTS), ("algo.kl_estimator", KL_ESTIMATORS),
      ("algo.kl_controller", KL_CONTROLLERS), ("algo.is_correction", IS_CORRECTIONS),
      ("algo.is_level", mismatch.LEVELS), ("algo.old_logp_source", OLD_LOGP_SOURCES),
      ("task.prompt_sampler", SAMPLERS), ("algo.gpg_alpha", advantages_group.GPG_ALPHA),
      ("algo.gdpo_whiten_over", advantages_group.GDPO_WHITEN_OVER),
      ("model.dtype", DTYPES), ("model.param_dtype", DTYPES),
      ("model.attention", ATTENTION_IMPLEMENTATIONS),
      ("sampling.sampler_dtype", SAMPLER_DTYPES),
      ("task.reward_on_failure", ("score_failure", "raise")),
      ("task.long_prompts", ("reject", "truncate")),
      ("task.name", TASK_NAMES), ("algo.pf_ppo", PF_PPO_METHODS),
      ("task.reward_fns_mode", ("replace", "add")),
      ("algo.reward_aggregation", REWARD_AGGREGATIONS),
      ("algo.ref_refresh", REF_REFRESH_MODES),
      ("algo.off_policy_correction", OFF_POLICY_CORRECTIONS),
  ):
    _choice(errors, c, dotted, allowed)
  for name in ("dtype", "param_dtype"):   # JAX would silently compute in float32
    if c.model[name] == "float64" and not jax.config.jax_enable_x64:
      errors.append(f"model.{name}='float64' needs JAX's 64-bit mode (JAX_ENABLE_X64=1 or "
                    "jax.config.update('jax_enable_x64', True) before JAX starts)")


def _check_ranges(errors, c):
  a, s, o = c.algo, c.sampling, c.optim
  _check(errors, 0.0 <= a.eps_low < 1.0, f"algo.eps_low={a.eps_low} must be in [0, 1)")
  _check(errors, a.eps_high >= 0.0, f"algo.eps_high={a.eps_high} must be >= 0")
  _check(errors, a.dual_clip == 0 or a.dual_clip > 1,
         f"algo.dual_clip={a.dual_clip} must be 0 (off) or > 1")
  _check(errors, a.ratio_cap == 0 or a.ratio_cap > 1,
         f"algo.ratio_cap={a.ratio_cap} must be 0 (off) or > 1")
  _check(errors, 0.0 <= a.gamma <= 1.0, f"algo.gamma={a.gamma} must be in [0, 1]")
  _check(errors, 0.0 <= a.lam <= 1.0, f"algo.lam={a.lam} must be in [0, 1]")
  _check(errors, a.kl_coef >= 0, f"algo.kl_coef={a.kl_coef} must be >= 0")
  _check(errors, 0.0 <= a.high_entropy_fraction <= 1.0,
         f"algo.high_entropy_fraction={a.high_entropy_fraction} must be in [0, 1]")
  _check(errors, a.tis_cap > 0, f"algo.tis_cap={a.tis_cap} must be > 0")
  _check(errors, 0 <= a.icepop_low < 1 < a.icepop_high,
         f"algo.icepop_low/high=({a.icepop_low}, {a.icepop_high}) must satisfy 0 <= low < 1 < high")
  _check(errors, 0.0 <= c.task.scratchpad_fraction <= 1.0,
         f"task.scratchpad_fraction={c.task.scratchpad_fraction} must be in [0, 1]")
  _check(errors, c.sft.worked_steps >= 0,
         f"sft.worked_steps={c.sft.worked_steps} must be >= 0 (capped at sft.steps)")
  _check(errors, c.sft.max_len >= 0,
         f"sft.max_len={c.sft.max_len} must be >= 0 (0: sampling.max_new_tokens)")
  _check(errors, s.temperature > 0, f"sampling.temperature={s.temperature} must be > 0")
  _check(errors, isinstance(s.slots, int) and s.slots >= 0,
         f"sampling.slots={s.slots!r} must be an int >= 0 (0: all rows)")
  _check(errors, 0 < s.top_p <= 1, f"sampling.top_p={s.top_p} must be in (0, 1]")
  _check(errors, s.top_k >= 0, f"sampling.top_k={s.top_k} must be >= 0 (0: off)")
  _check(errors, 0 <= s.min_p < 1, f"sampling.min_p={s.min_p} must be in [0, 1)")
  _check(errors, s.max_new_tokens >= 1, f"sampling.max_new_tokens={s.max_new_tokens} must be >= 1")
  _check(errors, a.gpg_f_norm > 0, f"algo.gpg_f_norm={a.gpg_f_norm} must be > 0")
  _check(errors, a.pf_ppo_power > 0, f"algo.pf_ppo_power={a.pf_ppo_power} must be > 0")
  _check(errors, s.n >= 1, f"sampling.n={s.n} must be >= 1")
  _check(errors, s.eval_n >= 0, f"sampling.eval_n={s.eval_n} must be >= 0")
  _check(errors, s.eval_passk_n == 0 or s.eval_passk_n > s.eval_n,
         f"sampling.eval_passk_n={s.eval_passk_n} must be 0 (off) or > sampling.eval_n="
         f"{s.eval_n}")
  _check(errors, s.eval_passk_prompts >= 0,
         f"sampling.eval_passk_prompts={s.eval_passk_prompts} must be >= 0 (0: all)")
  _check(errors, s.prompts_per_iteration >= 1,
         f"sampling.prompts_per_iteration={s.prompts_per_iteration} must be >= 1")
  for name in ("actor_lr", "critic_lr"):
    _check(errors, o[name] > 0, f"optim.{name}={o[name]} must be > 0")
  _check(errors, o.grad_clip >= 0, f"optim.grad_clip={o.grad_clip} must be >= 0 (0: off)")
  _check(errors, c.run.iterations >= 0, f"run.iterations={c.run.iterations} must be >= 0")
  _check(errors, c.run.keep_checkpoints >= 1,
         f"run.keep_checkpoints={c.run.keep_checkpoints} must be >= 1")
  _check(errors, c.run.max_nonfinite_in_row >= 1,
         f"run.max_nonfinite_in_row={c.run.max_nonfinite_in_row} must be >= 1")


def _check_mesh(errors, c, num_devices):
  p = c.parallel
  if p.expert > 1:   # the expert axis takes its share first (`rljax.parallel.make_mesh`)
    if num_devices % p.expert:
      errors.append(f"parallel.expert={p.expert} does not divide the {num_devices} devices")
      return
    num_devices //= p.expert
  sizes = [p.data, p.fsdp, p.tensor]
  if sum(1 for v in sizes if v == -1) > 1 or any(v == 0 or v < -1 for v in sizes):
    errors.append(f"parallel=(data={p.data}, fsdp={p.fsdp}, tensor={p.tensor}): each must be "
                  ">= 1, at most one may be -1 (all remaining devices)")
    return
  fixed = 1
  for v in sizes:
    fixed *= v if v > 0 else 1
  if num_devices % fixed:
    errors.append(f"parallel: fsdp*tensor*data={fixed} does not divide the {num_devices} devices")
    return
  sizes = [v if v > 0 else num_devices // fixed for v in sizes]   # -1: the remaining devices
  data, fsdp = sizes[0], sizes[1]
  if sizes[0] * sizes[1] * sizes[2] != num_devices:
    errors.append(f"parallel: data*fsdp*tensor={sizes[0] * sizes[1] * sizes[2]} must equal "
                  f"the {num_devices} devices")
    return
  batch_axes = data * fsdp
  split = max(c.algo.minibatches, 1) * max(c.algo.microbatches, 1)
  micro = max(c.sampling.prompts_per_iteration * c.sampling.n, 0) // split
  if micro % batch_axes:
    errors.append(f"the micro-batch of {micro} sequences is not divisible by the data*fsdp="
                  f"{batch_axes} mesh axes (parallel.data / parallel.fsdp)")


def validate(config, *, num_devices: int | None = None, max_positions: int | None = None):
  """Raises ConfigError naming every invalid field. Returns the config unchanged.

  Args:
    config: a full config (rljax.train.config.base_config() plus changes).
    num_devices: devices of the mesh (default: jax.device_count()).
    max_positions: the model's position limit, when known (checked against prompt +
      completion length).
  """
  errors: list[str] = []
  _check_choices(errors, config)
  _check_ranges(errors, config)
  checks.check_combinations(errors, config)
  check_distill(errors, config)     # algo.distill_*
  check_eval_sets(errors, config)   # eval.sets
  available = jax.device_count() if num_devices is None else num_devices
  requested = config.parallel.num_devices
  if requested < 0 or requested > available:
    errors.append(f"parallel.num_devices={requested} must be in [0, {available}] (0: all devices)")
  elif requested and num_devices is None and jax.process_count() > 1:
    try:   # several processes: each must contribute the same number of its devices
      select_devices(requested)
    except ValueError as e:
      errors.append(str(e))
  devices = requested or available
  sampler = config.parallel.sampler_devices if isinstance(config.parallel.sampler_devices,
                                                          int) else 0
  if 0 < sampler and sampler >= devices:
    errors.append(f"parallel.sampler_devices={sampler} leaves the trainer none of the "
                  f"{devices} devices")
  else:
    _check_mesh(errors, config, devices - max(sampler, 0))
  limit = max_positions or model_positions(config)
  if completion_columns(config) >= limit:
    errors.append(f"sampling.max_new_tokens={completion_columns(config)} leaves no room for "
                  f"the prompt within the model's {limit} positions")
  if errors:
    raise ConfigError("invalid config:\n  - " + "\n  - ".join(errors))
  return config
