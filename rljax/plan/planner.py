"""`plan(config, topology)`: every program of one RL iteration compiled for a TPU slice,
what each costs, whether it fits, and (when something does not) what would make it fit.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from rljax import parallel
from rljax.plan import search as fit_search
from rljax.plan.abstract import AbstractRun, abstract_run, per_chip_bytes
from rljax.plan.estimate import iteration, matmul_params
from rljax.plan.measure import measure
from rljax.plan.programs import iteration_programs, moe_layers, routes_entry
from rljax.plan.topology import (
  Topology,
  local_memory,
  local_topology,
  parse_topology,
  topology_devices,
)
from rljax.train.config import validate
from rljax.train.config.defaults import model_positions


@dataclasses.dataclass
class Target:
  """A resolved topology: its chips' figures and compile-only (or local) devices."""

  topology: Topology
  devices: list
  hbm_limit: float | None

  @classmethod
  def resolve(cls, name: str) -> Target:
    """The slice `name` names, its devices (compile-only for a TPU) and HBM limit.

    Raises:
      TopologyError, LibtpuMissing.
    """
    topology = parse_topology(name)
    devices = topology_devices(topology)
    if topology.chip is None:
      topology = local_topology(devices)
    limit = topology.chip.hbm_limit if topology.chip else local_memory(devices[0])
    return cls(topology=topology, devices=devices, hbm_limit=limit)


def _mesh(mesh) -> dict | None:
  return None if mesh is None else {a: int(mesh.shape[a]) for a in mesh.axis_names}


def state_bytes(run: AbstractRun) -> dict:
  """Per-chip bytes of what the run holds between programs (host-offloaded: 0)."""
  s = run.state
  out = {"params": per_chip_bytes(s.actor), "optimizer": per_chip_bytes(s.actor_opt),
         "base": per_chip_bytes(s.base), "reference": per_chip_bytes(s.ref),
         "critic": per_chip_bytes(s.critic) + per_chip_bytes(s.critic_opt),
         "teacher": per_chip_bytes(run.teacher.params) if run.teacher else 0.0}
  out["total"] = sum(out.values())
  return out


def _model(run: AbstractRun) -> dict:
  cfg, m = run.model_cfg, run.config.model
  count = sum(math.prod(x.shape) for x in jax.tree.leaves(run.params.initial_actor))
  return {"layers": cfg.num_layers, "hidden": cfg.hidden_size, "heads": cfg.num_heads,
          "kv_heads": cfg.num_kv_heads, "vocab": cfg.vocab_size, "params": int(count),
          "matmul_params": matmul_params(cfg), "dtype": cfg.dtype,
          "param_dtype": cfg.param_dtype, "remat": cfg.remat, "lora_rank": int(m.lora_rank),
          "attention": m.get("attention", "xla"), "source": m.hf_path or m.hf_config or "tiny",
          "experts": cfg.num_experts, "experts_per_token": cfg.num_experts_per_tok,
          "moe_layers": moe_layers(cfg)}


def routes_bytes(run: AbstractRun) -> dict | None:
  """Per-chip bytes of a MoE policy's recorded routes (None for a dense one): the sampler's
  buffer of the rows decoded together (`decode.route_buffer`, in the decode program's
  carry) and the rollout's (`RolloutBatch.routes`, an input of the forwards, and of the
  update with routing replay), each split over its mesh's batch axes."""
  s = run.shapes

  def per_chip(mesh, rows, columns):
    shape, dtype = routes_entry(run, rows, columns)
    shards = math.prod(mesh.shape[a] for a in parallel.BATCH_AXES if a in mesh.axis_names)
    return math.prod(shape) * jnp.dtype(dtype).itemsize / shards
  if routes_entry(run, 1, 1) is None:
    return None
  return {"sampler": per_chip(run.sampler_mesh or run.mesh, s.decode_rows,
                              s.sampler_prompt_len + s.response_len),
          "rollout": per_chip(run.mesh, s.rows, s.prompt_len + s.response_len),
          "dtype": jnp.dtype(routes_entry(run, 1, 1)[1]).name}


def compile_run(run: AbstractRun, target: Target, *, only=None, progress=None) -> list[dict]:
  """The reports of `run`'s programs (those named in `only`, default all)."""
  chips = len(target.devices)
  reports = []
  for program in iteration_programs(run):
    if only is not None and program.name not in only:
      continue
    if progress:
      progress(f"compiling {program.name} ...")
    report = measure(program, target.topology.chip, target.hbm_limit, chips)
    if progress:
      progress(f"  {program.name}: {report['compile_s']:.1f} s, "
               f"{report['per_chip_bytes']['total'] / 1e9:.2f} GB per chip, "
               f"{'fits' if report['fits'] else 'DOES NOT FIT'}")
    reports.append(report)
  return reports


def summary(run: AbstractRun, target: Target, reports: list[dict]) -> dict:
  """The plan's JSON object (see `rljax.plan`'s docstring for its fields)."""
  topo, chip = target.topology, target.topology.chip
  s = run.shapes
  estimate = iteration(reports, model_cfg=run.model_cfg, context=s.prompt_len + s.response_len,
                       chips=run.mesh.size, peak_flops=chip.peak_flops if chip else None,
                       lora=bool(run.config.model.lora_rank))
  notes = list(run.notes)
  rollout = run.specs.rollout
  if rollout.dynamic_sampling and rollout.dynamic_sampling_max_rounds > 1:
    notes.append(f"dynamic sampling may generate up to {rollout.dynamic_sampling_max_rounds} "
                 "rounds per iteration; the estimate counts one")
  c = run.config
  if c.task.env:
    notes.append("multi-turn episodes are planned as one generation of "
                 "sampling.max_total_tokens (the episodic sampler's own program is not compiled)")
  unplanned = [what for what, on in (("the supervised warm start (sft.steps)", c.sft.steps),
                                     ("rejection-sampling SFT (algo.rsft_every)", c.algo.rsft_every),
                                     ("held-out evaluation (its own sampling)", c.run.eval_every))
               if on]
  if unplanned:
    notes.append("not planned: " + "; ".join(unplanned))
  failed = [r["name"] for r in reports if not r["compiled"]]
  if failed:
    notes.append(f"{', '.join(failed)} did not compile: their roofline counts their model "
                 "FLOPs only (no bytes), and the update's MFU is not estimated")
  if run.sampler_mesh is not None:
    notes.append(f"the sampler has {run.sampler_mesh.size} chips of its own (each share "
                 "compiled as a slice of its size); with sampling.max_staleness > 0 generation "
                 "overlaps the update, so an iteration takes about the larger of the two, not "
                 "their sum")
  return {
      "topology": topo.name, "chips": len(target.devices),
      "libtpu_topology": topo.libtpu_name if topo.shape else "local",
      "chip": None if chip is None else dataclasses.asdict(chip) | {"hbm_limit": chip.hbm_limit},
      "mesh": _mesh(run.mesh), "sampler_mesh": _mesh(run.sampler_mesh),
      "fits": all(r["fits"] for r in reports), "model": _model(run),
      "shapes": dataclasses.asdict(s), "state_bytes": state_bytes(run),
      "routes_bytes": routes_bytes(run), "programs": reports,
      "iteration": estimate, "notes": notes}


def plan(config, topology: str | Target, *, search: int = 3, progress=None) -> dict:
  """Compiles every program of one iteration of `config` for `topology`.

  Args:
    config: a loaded config (validated again here against the slice's chips).
    topology: a slice name (`rljax.plan.topology.parse_topology`) or a resolved `Target`.
    search: when something does not fit, compile up to this many alternative settings
      (`rljax.plan.search`); 0: only list them.
    progress: optional callable for progress lines.
  Raises:
    TopologyError, LibtpuMissing, ConfigError.
  """
  target = topology if isinstance(topology, Target) else Target.resolve(topology)
  validate(config, num_devices=len(target.devices), max_positions=model_positions(config))
  run = abstract_run(config, target.devices, target.topology)
  result = summary(run, target, compile_run(run, target, progress=progress))
  if not result["fits"]:
    result["search"] = fit_search.search(config, run, target, result, budget=search,
                                         compile_fn=compile_run, progress=progress)
  return result
