"""When a plan does not fit: the settings that might, ranked, and (within a budget)
compiled to check.

Candidates, from the least to the most change to the run: another `data × fsdp × tensor`
factorisation of the slice, more micro-batches, remat, a memory-linear attention (when
`model.attention` is xla), the static sampler (its parameters
stay sharded where the continuous sampler gathers them on every device), fewer decode
slots, the reference in host memory, all of these together, and LoRA (which changes the
method). Each is scored by
a coarse estimate of the failing programs' per-chip bytes: the run's state scales as its
exact per-chip size under the candidate, activations with the rows each chip holds, the
micro-batch split, remat, the tensor split and (attention) a tile of ATTENTION_TILE keys in
place of S. The estimate only orders them; a candidate
counts as fitting once its programs compile within the chip's HBM.
"""

from __future__ import annotations

import copy
import dataclasses

from rljax import parallel
from rljax.plan.abstract import abstract_run, per_chip_bytes
from rljax.train.config import ConfigError, apply_overrides, validate
from rljax.train.config.defaults import model_positions

TRAINING = ("update", "logprobs", "routing", "values", "teacher")
SAMPLING = ("prefill", "decode")
REMAT_KEEPS = 0.35   # share of the update's activations left with remat (coarse)
LORA_RANK = 64
ATTENTION_TILE = 512   # keys a memory-linear attention holds per query block (coarse)


@dataclasses.dataclass
class Candidate:
  """A change to the config (`overrides`, as `--config.FIELD=VALUE`) and what it did."""

  overrides: dict
  why: str
  estimate: float = 0.0     # estimated largest per-chip total of the failing programs
  tried: bool = False
  fits: bool | None = None
  totals: dict = dataclasses.field(default_factory=dict)


def _divisors(n: int) -> list[int]:
  return [d for d in range(1, n + 1) if n % d == 0]


def mesh_candidates(config, chips: int, kv_heads: int) -> list[dict]:
  """Every (data, fsdp, tensor) of `chips` devices with tensor dividing the KV heads and
  whole micro-batches on the batch axes (beside the config's `parallel.expert` axis)."""
  a, s = config.algo, config.sampling
  chips //= max(config.parallel.expert, 1)
  micro = s.prompts_per_iteration * s.n // (a.minibatches * a.microbatches)
  out = []
  for tensor in _divisors(chips):
    if kv_heads % tensor:
      continue
    for data in _divisors(chips // tensor):
      fsdp = chips // tensor // data
      if micro % (data * fsdp) == 0:
        out.append({"parallel.data": data, "parallel.fsdp": fsdp, "parallel.tensor": tensor})
  return out


def _variant(config, overrides: dict, chips: int):
  """A validated copy of `config` with `overrides`, or None when they are invalid."""
  new = copy.deepcopy(config)
  try:
    apply_overrides(new, overrides)
    validate(new, num_devices=chips, max_positions=model_positions(new))
  except (ConfigError, KeyError, ValueError):
    return None
  return new


def _scale(run, new_run, overrides: dict, report: dict) -> float:
  """The coarse per-chip estimate of `report`'s program under `new_run` (module doc)."""
  b = report["per_chip_bytes"]
  state = b["arguments"] + b["resident"]
  act = b["temporaries"] + b["outputs"] - b["aliases"]
  state *= per_chip_bytes(new_run.state) / max(per_chip_bytes(run.state), 1.0)
  rows = lambda r: parallel.batch_shards(r.mesh)  # noqa: E731
  tensor = lambda r: 0.5 + 0.5 / r.mesh.shape["tensor"]  # noqa: E731
  act *= rows(run) / rows(new_run) * tensor(new_run) / tensor(run)
  name = report["name"]
  if name in TRAINING:
    act *= run.shapes.microbatches / new_run.shapes.microbatches
  if name == "update" and overrides.get("model.remat") and not run.model_cfg.remat:
    act *= REMAT_KEEPS
  if "model.attention" in overrides and name in (*TRAINING, "prefill"):   # S keys -> a tile
    s = run.shapes
    keys = s.sampler_prompt_len if name == "prefill" else s.prompt_len + s.response_len
    act *= min(1.0, ATTENTION_TILE / keys)
  if name == "decode" and "sampling.slots" in overrides:   # the cache and carry scale
    ratio = new_run.shapes.decode_rows / run.shapes.decode_rows
    params = per_chip_bytes(run.state.actor)
    return b["resident"] + params + (b["arguments"] - params + act) * ratio
  if name in SAMPLING and overrides.get("sampling.continuous") is False:
    shard = per_chip_bytes(new_run.state.actor)   # gathered whole per device, twice (fused)
    whole = shard * new_run.mesh.shape["fsdp"] * new_run.mesh.shape["tensor"]
    act = max(act - 2 * (whole - shard), 0.0)
  return state + act


def _proposals(config, run, failing: list[str], chips: int) -> list[tuple[dict, str]]:
  a, m, s = config.algo, config.model, config.sampling
  current = {"parallel.data": run.mesh.shape["data"], "parallel.fsdp": run.mesh.shape["fsdp"],
             "parallel.tensor": run.mesh.shape["tensor"]}
  out = [(mesh, "another data x fsdp x tensor factorisation")
         for mesh in mesh_candidates(config, chips, run.model_cfg.num_kv_heads) if mesh != current]
  minibatch = run.shapes.minibatch
  for k in (2, 4, 8, 16):
    micro = a.microbatches * k
    if minibatch % micro == 0:
      out.append(({"algo.microbatches": micro}, f"{k}x more micro-batches"))
  if not m.remat:
    out.append(({"model.remat": True}, "rematerialise each decoder block"))
  if m.attention == "xla":
    out.append(({"model.attention": "auto"},
                "a memory-linear attention (splash on TPU): no [B, H, S, S] scores"))
  if s.continuous and any(name in SAMPLING for name in failing):
    out.append(({"sampling.continuous": False}, "the static sampler: parameters stay sharded"))
  shards = parallel.batch_shards(run.mesh)
  if s.continuous and "decode" in failing:
    for k in (2, 4, 8):
      slots = run.shapes.decode_rows // k // shards * shards
      if slots >= shards:
        out.append(({"sampling.slots": slots}, f"{k}x fewer decode slots (a smaller KV cache)"))
  if run.state.ref is not None and not a.reference_offload:
    out.append(({"algo.reference_offload": True}, "the reference in host memory"))
  if not m.lora_rank:
    out.append(({"model.lora_rank": LORA_RANK},
                f"LoRA rank {LORA_RANK} (changes the method: adapters train, the base is frozen)"))
  return out


def _combined(scored: list[Candidate]) -> dict:
  """The best-estimated mesh with every other non-LoRA change."""
  out = {}
  meshes = [c for c in scored if "parallel.fsdp" in c.overrides]
  if meshes:
    out.update(min(meshes, key=lambda c: c.estimate).overrides)
  micro = [c.overrides["algo.microbatches"] for c in scored if "algo.microbatches" in c.overrides]
  if micro:
    out["algo.microbatches"] = max(micro)
  for c in scored:
    if not ({"parallel.fsdp", "algo.microbatches", "model.lora_rank"} & set(c.overrides)):
      out.update(c.overrides)
  return out


def candidates(config, run, reports: list[dict], target) -> list[Candidate]:
  """Every proposal for the failing programs of `reports`, with its estimate, ranked:
  those estimated to fit first (fewest changes first, LoRA last), then the others by
  their estimate."""
  devices, chips = target.devices, len(target.devices)
  failing = [r for r in reports if not r["fits"]]
  names = [r["name"] for r in failing]
  scored = []
  proposals = _proposals(config, run, names, chips)
  for overrides, why in proposals:
    new = _variant(config, overrides, chips)
    if new is None:
      continue
    new_run = abstract_run(new, devices, target.topology)
    estimate = max(_scale(run, new_run, overrides, r) for r in failing)
    scored.append(Candidate(overrides, why, estimate))
  combo = _combined(scored)
  fresh = all(combo != c.overrides for c in scored)
  if fresh and len(combo) > 1 and _variant(config, combo, chips) is not None:
    new_run = abstract_run(_variant(config, combo, chips), devices, target.topology)
    scored.append(Candidate(combo, "these changes together",
                            max(_scale(run, new_run, combo, r) for r in failing)))
  limit = failing[0]["hbm_bytes"] or float("inf")

  def rank(c):   # estimated to fit: the smallest change first; else the smallest estimate
    lora = "model.lora_rank" in c.overrides   # changes the method: last in either group
    if c.estimate > limit:
      return (1, lora, 0, c.estimate)
    return (0, lora, len(c.overrides), c.estimate)
  return sorted(scored, key=rank)


def search(config, run, target, result: dict, *, budget: int, compile_fn, progress=None) -> dict:
  """{"candidates": [...], "suggestion": ...}: the ranked candidates; the first `budget`
  compiled (the failing programs first, the others once those fit); the suggestion is the
  first that fits, else the first untried one estimated to fit, else None."""
  reports = result["programs"]
  chips = len(target.devices)
  ranked = candidates(config, run, reports, target)
  failing = [r["name"] for r in reports if not r["fits"]]
  suggestion = None
  for candidate in ranked[:budget]:
    if progress:
      progress(f"trying {candidate.overrides} ({candidate.why}) ...")
    new_run = abstract_run(_variant(config, candidate.overrides, chips), target.devices,
                           target.topology)
    tried = compile_fn(new_run, target, only=failing)
    if all(r["fits"] for r in tried):
      others = [r["name"] for r in reports if r["name"] not in failing]
      tried += compile_fn(new_run, target, only=others)
    candidate.tried, candidate.fits = True, all(r["fits"] for r in tried)
    candidate.totals = {r["name"]: r["per_chip_bytes"]["total"] for r in tried}
    if candidate.fits:
      suggestion = candidate
      break
  limit = target.hbm_limit or float("inf")
  if suggestion is None:   # untried, but estimated to fit; else nothing to suggest
    suggestion = next((c for c in ranked if not c.tried and c.estimate <= limit), None)
  return {"candidates": [dataclasses.asdict(c) for c in ranked],
          "suggestion": dataclasses.asdict(suggestion) if suggestion else None,
          "budget": budget}
