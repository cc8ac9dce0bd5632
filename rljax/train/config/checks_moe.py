"""Checks of the mixture-of-experts fields: the tiny decoder's experts, routing replay, the
load-balancing terms, and the sampler's dtype (called by
`rljax.train.config.checks.check_combinations`)."""

from __future__ import annotations

from rljax.models.presets import hf_config_dict

ROUTING_REPLAY = ("none", "sampler")


def policy_experts(config) -> int:
  """E, the routed experts of the policy's MoE layers (0 for a dense policy): from
  `model.hf_config` / `model.hf_path`'s config.json when set and readable, else
  `model.num_experts`."""
  source = config.model.hf_config or config.model.hf_path
  if source:
    try:
      hf = hf_config_dict(source)
    except ValueError:
      return 0
    return int(hf.get("num_experts", hf.get("num_local_experts")) or 0)
  return int(config.model.num_experts)


def check_moe(errors, c):
  """model.num_experts & co., algo.routing_replay, algo.moe_*_coef, sampling.sampler_dtype."""
  m, a = c.model, c.algo
  if m.num_experts < 0:
    errors.append(f"model.num_experts={m.num_experts} must be >= 0 (0: dense)")
  elif m.num_experts:
    if not 1 <= m.num_experts_per_tok <= m.num_experts:
      errors.append(f"model.num_experts_per_tok={m.num_experts_per_tok} must be in [1, "
                    f"model.num_experts={m.num_experts}]")
    if m.moe_intermediate_size < 1 or m.moe_sparse_step < 1:
      errors.append(f"model.moe_intermediate_size={m.moe_intermediate_size} and "
                    f"model.moe_sparse_step={m.moe_sparse_step} must be >= 1")
  _check_expert_axis(errors, c)
  if a.routing_replay not in ROUTING_REPLAY:
    errors.append(f"algo.routing_replay={a.routing_replay!r} is not one of {list(ROUTING_REPLAY)}")
  for name in ("moe_aux_loss_coef", "moe_z_loss_coef"):
    if a[name] < 0:
      errors.append(f"algo.{name}={a[name]} must be >= 0 (0: off)")
  routed = [f"algo.{n}={a[n]!r}" for n in ("moe_aux_loss_coef", "moe_z_loss_coef") if a[n] > 0]
  if a.routing_replay == "sampler":
    routed.insert(0, "algo.routing_replay='sampler'")
  if not routed:
    return
  if not policy_experts(c):
    errors.append(f"{routed[0]} needs a mixture-of-experts policy (model.num_experts > 0, or a "
                  "Qwen3-MoE / Qwen2-MoE model.hf_path / model.hf_config); this one is dense")
  if a.pack_sequences:
    errors.append(f"{routed[0]} reads the routing of the padded forward: it needs "
                  "algo.pack_sequences=False")
  if a.routing_replay == "sampler" and (c.task.env or c.sampling.partial_rollouts):
    errors.append("algo.routing_replay='sampler' replays the single-turn samplers' routes: "
                  "multi-turn episodes (task.env) and sampling.partial_rollouts record none")


def _check_expert_axis(errors, c):
  """parallel.expert: a size that splits the policy's experts evenly (1: no expert axis)."""
  size = c.parallel.expert
  if size == 1:
    return
  experts = policy_experts(c)
  if size < 1:
    errors.append(f"parallel.expert={size} must be >= 1 (1: no expert axis)")
  elif not experts:
    errors.append(f"parallel.expert={size} splits a mixture-of-experts policy's experts; this "
                  "policy is dense (model.num_experts = 0)")
  elif experts % size:
    errors.append(f"parallel.expert={size} must divide the policy's {experts} experts")


def check_sampler_dtype(errors, c):
  """sampling.sampler_dtype samples with a cast copy of a plain decoder (no adapters)."""
  if c.sampling.sampler_dtype and c.model.lora_rank:
    errors.append(f"sampling.sampler_dtype={c.sampling.sampler_dtype!r} casts a plain decoder: "
                  "it does not support LoRA adapters (model.lora_rank > 0)")
