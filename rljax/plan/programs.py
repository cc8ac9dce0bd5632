"""The programs of one RL iteration, made by the trainer's own builders and lowered for the
plan's mesh (nothing is run): the jitted update step (`build_update_step`: micro-batches,
remat, optimizer state, LoRA), the old/reference log-prob forward (`ForwardFns`), the
critic's values forward (GAE runs), the teacher's forward (distillation) and the sampler's
prefill and decode step (`rljax.plan.sampler`).

Each `Program` also says how often an iteration calls it and which of the run's arrays stay
in device memory while it runs without being its arguments (`resident`: the optimizer
state during a forward, the reference during the update, the teacher throughout).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from rljax.models.moe import route_dtype
from rljax.parallel import batch_sharding
from rljax.plan.abstract import AbstractRun, per_chip_bytes
from rljax.plan.estimate import forward_flops_per_token, training_flops_per_token
from rljax.plan.sampler import SamplerPrograms
from rljax.train.params import policy_params
from rljax.train.update.forward import SEQUENCE_KEYS, ForwardFns
from rljax.train.update.packing import rows_per_pack
from rljax.train.update.step import build_update_step, step_fields

# dtype and width ("P": prompt columns, "T": completion columns, int: fixed) of every entry
# of the update step's minibatch (`rljax.train.update.step.step_fields`) and of the
# forwards' sequences (`SEQUENCE_KEYS`)
ENTRIES = {"prompt_tokens": (jnp.int32, "P"), "prompt_mask": (jnp.int32, "P"),
           "tokens": (jnp.int32, "T"), "mask": (jnp.int32, "T"), "rng": (jnp.uint32, 2),
           **{k: (jnp.float32, "T") for k in ("old_logp", "ref_logp", "advantages", "returns",
                                              "old_values", "token_weights", "is_weights",
                                              "sampler_logp")}}


@dataclasses.dataclass
class Program:
  """One program of the iteration.

  Attributes:
    name: update | logprobs | values | teacher | prefill | decode.
    lower: () -> (`jax.stages.Lowered`, its abstract arguments); tracing happens then.
    calls: calls per iteration (decode: per generated token).
    resident: per-chip bytes of the run's arrays in device memory while it runs, beyond
      its own arguments.
    tokens: tokens it processes per call.
    model_flops: the model FLOPs of one call on one chip (PaLM's count,
      `rljax.plan.estimate`), for a program the compiler cannot report on.
  """

  name: str
  lower: Callable
  calls: float
  resident: float
  tokens: int
  model_flops: float = 0.0


def _rows(mesh, shape, dtype):
  return jax.ShapeDtypeStruct(shape, dtype, sharding=batch_sharding(mesh, len(shape)))


def moe_layers(cfg) -> int:
  """L_moe: the decoder layers with a mixture-of-experts MLP (0: dense)."""
  return sum(cfg.is_moe_layer(i) for i in range(cfg.num_layers))


def routes_entry(run: AbstractRun, rows: int, columns: int):
  """The sampler's recorded experts of `rows` rows, [rows, columns, L_moe, k] in
  `route_dtype(E)` (`RolloutBatch.routes`), or None for a dense policy."""
  cfg = run.model_cfg
  if not moe_layers(cfg):
    return None
  return (rows, columns, moe_layers(cfg), cfg.num_experts_per_tok), route_dtype(cfg.num_experts)


def batch(run: AbstractRun, rows: int, keys, groups: int) -> dict:
  """Abstract batch entries `keys` of `rows` rows (split over the batch axes), plus the
  packing layout of `groups` groups when the run packs (its worst case: no two sequences
  share a row, K = rows per group)."""
  s = run.shapes
  widths = {"P": s.prompt_len, "T": s.response_len}
  out = {}
  for key in keys:
    if key == "routes":   # a MoE rollout's recorded experts, every prompt and completion column
      out[key] = _rows(run.mesh, *routes_entry(run, rows, s.prompt_len + s.response_len))
      continue
    if key not in ENTRIES:
      raise NotImplementedError(f"rljax plan does not know the batch entry {key!r}")
    dtype, width = ENTRIES[key]
    out[key] = _rows(run.mesh, (rows, widths.get(width, width)), dtype)
  if run.specs.loss.pack_groups:
    packed = groups * rows_per_pack(rows // groups, rows // groups)
    width = s.prompt_len + s.response_len
    out.update(pack_src=_rows(run.mesh, (packed, width), jnp.int32),
               pack_segment=_rows(run.mesh, (packed, width), jnp.int32),
               pack_hidden=_rows(run.mesh, (rows, s.response_len), jnp.int32))
  return out


def minibatch(run: AbstractRun) -> dict:
  """The update step's input, as `update.Epochs.minibatch` makes it."""
  s, loss = run.shapes, run.specs.loss
  out = batch(run, s.minibatch, step_fields(loss), s.microbatches * loss.pack_groups)
  replicated = NamedSharding(run.mesh, PartitionSpec())
  out["kl_coef"] = jax.ShapeDtypeStruct((), jnp.float32, sharding=replicated)
  if run.specs.schedule.ptx_coef:   # host demonstrations: placed whole on every device
    width = {"prompt_tokens": s.prompt_len, "prompt_mask": s.prompt_len,
             "tokens": s.response_len, "mask": s.response_len}
    out["ptx"] = {k: jax.ShapeDtypeStruct((s.minibatch, w), jnp.int32, sharding=replicated)
                  for k, w in width.items()}
  return out


def update_program(run: AbstractRun, teacher_bytes: float) -> Program:
  """The jitted update step `build_update_step` makes, on the plan's state and minibatch
  (`epochs x minibatches` calls; the reference and a teacher stay resident)."""
  s, specs, p, state = run.shapes, run.specs, run.params, run.state
  step = build_update_step(specs.loss, p.actor_graphdef, p.critic_graphdef, p.actor_tx,
                           p.critic_tx, s.microbatches,
                           state_shardings=jax.tree.map(lambda x: x.sharding, state),
                           mesh=run.mesh)
  train_actor = jax.ShapeDtypeStruct((), jnp.bool_,
                                     sharding=NamedSharding(run.mesh, PartitionSpec()))

  def lower():
    mb = minibatch(run)
    return step.lower(state, mb, train_actor), (state._replace(ref=None), mb, train_actor)
  context = s.prompt_len + s.response_len
  tokens = s.minibatch * context
  flops = tokens * training_flops_per_token(run.model_cfg, context, lora=p.lora)
  return Program("update", lower, calls=specs.schedule.epochs * specs.schedule.minibatches,
                 resident=per_chip_bytes(state.ref) + teacher_bytes, tokens=tokens,
                 model_flops=flops / run.mesh.size)


def _forward(jitted, params, sequences):
  """`lower` of a jitted forward `jitted(params, sequences())`."""
  def lower():
    seqs = sequences()
    return jitted.lower(params, seqs), (params, seqs)
  return lower


def forward_programs(run: AbstractRun, teacher_bytes: float) -> list[Program]:
  """logprobs (old and/or reference), values (critic) and teacher forwards that run."""
  s, specs, p, state = run.shapes, run.specs, run.params, run.state
  num_micro = s.microbatches
  fns = ForwardFns(specs.loss, p.actor_graphdef, p.critic_graphdef, num_micro=num_micro,
                   mesh=run.mesh)
  routed = moe_layers(run.model_cfg) > 0   # a MoE rollout carries the sampler's routes
  keys = SEQUENCE_KEYS + ("routes",) * routed
  seqs = lambda: batch(run, s.rows, keys, fns.pack_groups or 1)  # noqa: E731
  context = s.prompt_len + s.response_len
  tokens = s.rows * context
  flops = tokens * forward_flops_per_token(run.model_cfg, context) / run.mesh.size
  state_bytes = per_chip_bytes(state)
  policy = policy_params(state)
  out = []
  # the reference forward of an offloaded reference fetches a device copy for the call
  offloaded = state.ref is not None and specs.sources.reference_offload
  resident = state_bytes - (0 if offloaded else per_chip_bytes(policy))
  calls = (specs.sources.old_logp_source == "recompute") + p.has_reference(state)
  if routed and specs.sources.old_logp_source != "update":
    # the policy's forward of a MoE rollout runs twice, own routing and replayed, for the
    # old log-probs and the routing metrics (`update.prepare`, `ForwardFns.policy_routed`)
    out.append(Program("routing", _forward(fns.policy_routed, policy, seqs), 1,
                       state_bytes - per_chip_bytes(policy) + teacher_bytes, tokens, 2 * flops))
    calls = p.has_reference(state)
  if calls:
    out.append(Program("logprobs", _forward(fns.policy_stats, policy, seqs), calls,
                       resident + teacher_bytes, tokens, flops))
  if state.critic is not None:
    out.append(Program("values", _forward(fns.values, state.critic, seqs), 1,
                       state_bytes - per_chip_bytes(state.critic) + teacher_bytes, tokens,
                       flops))
  if run.teacher is not None:
    tfns = ForwardFns(specs.loss, run.teacher.graphdef, None, num_micro=num_micro,
                      mesh=run.mesh)
    teacher = tokens * forward_flops_per_token(run.teacher_cfg, context) / run.mesh.size
    out.append(Program("teacher", _forward(tfns.policy_stats, run.teacher.params, seqs), 1,
                       state_bytes, tokens, teacher))
  return out


def sampler_programs(run: AbstractRun, teacher_bytes: float) -> list[Program]:
  """prefill (once per generation round) and decode (once per generated token)."""
  s, state = run.shapes, run.state
  sampler = SamplerPrograms(run)
  if run.sampler_mesh is not None:   # its own devices hold only the sampler's weights
    resident = 0.0
  else:   # the weights it samples with are the policy's own (no copy)
    resident = per_chip_bytes(state) - per_chip_bytes(policy_params(state)) + teacher_bytes
  # dynamic sampling may need more rounds (up to algo.dynamic_sampling_max_rounds): the
  # plan counts one, the report says so
  cfg, chips = run.model_cfg, (run.sampler_mesh or run.mesh).size
  group = run.specs.rollout.n if run.specs.rollout.share_prefill else 1
  p, context = s.sampler_prompt_len, s.sampler_prompt_len + s.response_len
  # the static sampler runs both once per wave of decode_rows rows (`sampling.slots`)
  waves = 1 if run.specs.rollout.continuous else s.rows // s.decode_rows
  rows = s.rows // waves
  prefill = rows // group * p * forward_flops_per_token(cfg, p) / chips
  decode = s.decode_rows * forward_flops_per_token(cfg, context) / chips
  return [Program("prefill", sampler.prefill, waves, resident, rows * p, prefill),
          Program("decode", sampler.decode, s.response_len * waves, resident, s.decode_rows,
                  decode)]


def iteration_programs(run: AbstractRun) -> list[Program]:
  """Every program one iteration of `run` runs, in the order it runs them."""
  teacher = per_chip_bytes(run.teacher.params) if run.teacher is not None else 0.0
  return (sampler_programs(run, teacher) + forward_programs(run, teacher)
          + [update_program(run, teacher)])
