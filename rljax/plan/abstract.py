"""The run a config describes, without weights: its meshes, the policy (and critic, teacher)
as abstract parameters with the trainer's shardings, the TrainState `Params.init_state`
would make, and the shapes of its batches.

Everything comes from the trainer's own builders (`rljax.train.run.build.meshes`,
`rljax.train.run.task_and_models.model_config`, `build_specs`, `Params`, the optimizers); the
parameters are `nnx.eval_shape`d, so a 70B model costs no memory here.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from rljax import parallel
from rljax.models import Decoder, ModelConfig, config_from_hf
from rljax.models.heads import ValueModel
from rljax.models.presets import hf_config_dict
from rljax.plan.topology import sub_topology, topology_devices
from rljax.sampling import buckets
from rljax.train.config import ConfigError, saved_config
from rljax.train.config.defaults import distill_teacher_dir
from rljax.train.config.specs import Specs, build_specs
from rljax.train.params import Params, Teacher, TrainState
from rljax.train.params.offload import HOST_MEMORY_KIND
from rljax.train.params.state import optimizer_shardings
from rljax.train.params.teacher import is_run_dir
from rljax.train.rollout.single_turn import static_waves, wave_rows
from rljax.train.run import task_and_models
from rljax.train.run.build import meshes


@dataclasses.dataclass(frozen=True)
class Shapes:
  """The batch shapes of one iteration.

  Attributes:
    rows: B, rollout rows (prompts × n): the forwards' batch and the sampler's requests.
    prompt_len: P, the trainer's prompt columns.
    sampler_prompt_len: the sampler's prompt bucket (P rounded up to a power of two).
    response_len: T, completion columns.
    minibatch: rows of one update step; microbatches: its `lax.scan` split.
    decode_rows: rows decoded together (all rows, or `sampling.slots`: the continuous
      sampler's slots, the static sampler's waves).
  """

  rows: int
  prompt_len: int
  sampler_prompt_len: int
  response_len: int
  minibatch: int
  microbatches: int
  decode_rows: int


@dataclasses.dataclass
class AbstractRun:
  """A config's run as shapes and shardings (see the module doc)."""

  config: object
  specs: Specs
  model_cfg: ModelConfig
  mesh: object
  sampler_mesh: object          # None: the sampler shares `mesh`
  params: Params                # initial_actor / initial_critic: abstract, sharded
  state: TrainState             # abstract, as `Params.init_state` places it
  teacher: Teacher | None
  shapes: Shapes
  notes: list = dataclasses.field(default_factory=list)
  teacher_cfg: ModelConfig | None = None


def sharded(tree, shardings):
  """ShapeDtypeStructs of `tree`'s leaves carrying `shardings`' leaves."""
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                      tree, shardings)


def abstract_module(make, mesh):
  """(graphdef, abstract state with the logical-axis shardings on `mesh`) of `make()`."""
  graphdef, state = nnx.split(nnx.eval_shape(make))
  return graphdef, sharded(state, parallel.state_shardings(state, mesh))


def _placed(tree, mesh):
  """`place_state`'s rule on abstract leaves: a NamedSharding on `mesh` stays, the rest
  (optimizer counts, scalars) is replicated."""
  replicated = NamedSharding(mesh, PartitionSpec())

  def put(x):
    s = getattr(x, "sharding", None)
    keep = isinstance(s, NamedSharding) and s.mesh == mesh
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s if keep else replicated)
  return jax.tree.map(put, tree)


def optimizer_state(tx, params, mesh):
  """The abstract state `init_optimizer_state(tx, params)` makes (`optimizer_shardings`)."""
  return _placed(sharded(jax.eval_shape(tx.init, params), optimizer_shardings(tx, params)),
                 mesh)


def init_state(params: Params) -> TrainState:
  """`Params.init_state` on abstract parameters: the same TrainState fields, placements
  and reference rule (a copy of the actor unless LoRA's base is the reference; in host
  memory with `algo.reference_offload`)."""
  mesh, sources = params.mesh, params.sources
  actor, base = params.split(params.initial_actor)
  critic = params.initial_critic
  copy_reference = sources.has_reference and base is None
  ref = actor if copy_reference else None
  if ref is not None and sources.reference_offload:
    ref = jax.tree.map(lambda x: jax.ShapeDtypeStruct(
        x.shape, x.dtype, sharding=x.sharding.with_memory_kind(HOST_MEMORY_KIND)), ref)
  scalar = lambda dtype, shape=(): jax.ShapeDtypeStruct(  # noqa: E731
      shape, dtype, sharding=NamedSharding(mesh, PartitionSpec()))
  return TrainState(
      step=scalar(jnp.int32), iteration=scalar(jnp.int32), actor=actor,
      actor_opt=optimizer_state(params.actor_tx, actor, mesh), critic=critic,
      critic_opt=(optimizer_state(params.critic_tx, critic, mesh)
                  if critic is not None else None),
      base=base, ref=ref, kl_coef=scalar(jnp.float32), rng=scalar(jnp.uint32, (2,)),
      skipped_updates=scalar(jnp.int32), nonfinite_in_row=scalar(jnp.int32))


def model_and_tokenizer(config):
  """(policy ModelConfig, tokenizer or None): the tokenizer is built (as `rljax train`
  builds it) only when the tiny model's vocabulary or the prompt columns need it."""
  m = config.model
  needs_tokenizer = not config.plan.prompt_len or not (m.hf_path or m.hf_config or m.vocab_size)
  tokenizer = task = None
  if needs_tokenizer:
    task = task_and_models.build_task(config)
    tokenizer = task_and_models.build_tokenizer(config, task)
  model_cfg = task_and_models.model_config(config, tokenizer.vocab_size if tokenizer else 0)
  return model_cfg, tokenizer, task


def prompt_columns(config, model_cfg, tokenizer, task) -> int:
  """P: `plan.prompt_len`, else the task's prompt bucket as `rljax train` computes it."""
  if config.plan.prompt_len:
    return int(config.plan.prompt_len)
  return task_and_models.prompt_length(config, task, tokenizer, model_cfg.max_position_embeddings)


def teacher_config(config) -> ModelConfig | None:
  """The distillation teacher's architecture as `task_and_models.build_teacher` would load it (a
  run directory's model or a Hugging Face directory's config.json; `distill_teacher_dtype`
  or the source's own), or None without a teacher or when its directory is not there."""
  source, dtype = distill_teacher_dir(config), config.algo.distill_teacher_dtype
  if not source or not pathlib.Path(source).is_dir():
    return None
  if is_run_dir(source):
    cfg = task_and_models.model_config(saved_config(source), 0)
    return cfg.replace(dtype=dtype, param_dtype=dtype) if dtype else cfg
  return config_from_hf(hf_config_dict(source), dtype=dtype or None, param_dtype=dtype or None)


def _shapes(config, specs: Specs, prompt_len: int, sampler_mesh) -> Shapes:
  s = specs.schedule
  rows = specs.rollout.prompts_per_iteration * specs.rollout.n
  shards = parallel.batch_shards(sampler_mesh)
  requests = buckets.round_up(rows, None, multiple_of=shards)
  slots = specs.rollout.slots
  if specs.rollout.continuous:
    decode = max(shards, min(requests, slots) // shards * shards) if slots else requests
  else:   # the static sampler's waves (`rljax.train.rollout.single_turn.static_waves`)
    decode = wave_rows(static_waves(slots, requests, shards), requests, shards)
  return Shapes(rows=rows, prompt_len=prompt_len,
                sampler_prompt_len=buckets.round_up(prompt_len, "pow2"),
                response_len=specs.rollout.max_new_tokens, minibatch=rows // s.minibatches,
                microbatches=s.microbatches, decode_rows=decode)


def _params(config, model_cfg, mesh, specs: Specs) -> Params:
  seed = config.run.seed
  actor_gd, actor = abstract_module(
      lambda: task_and_models.add_lora_of(config, Decoder(model_cfg, rngs=nnx.Rngs(seed))), mesh)
  critic_gd = critic = None
  if config.algo.advantage == "gae":
    critic_gd, critic = abstract_module(
        lambda: ValueModel(model_cfg, rngs=nnx.Rngs(seed + 1)), mesh)
  return Params(actor_graphdef=actor_gd, critic_graphdef=critic_gd, initial_actor=actor,
                initial_critic=critic, actor_tx=task_and_models.optimizer(config, config.optim.actor_lr),
                critic_tx=task_and_models.optimizer(config, config.optim.critic_lr), mesh=mesh,
                sources=specs.sources, seed=seed, lora=bool(config.model.lora_rank))


def _split(topology):
  """`meshes`' device split for compile-only devices: each share of the slice becomes a
  slice of its own (`sub_topology`); the host's own devices split as the trainer does."""
  def split(devices, sampler_count):
    trainer, sampler = parallel.split_devices(devices, sampler_count)
    if topology is None or not topology.shape:
      return trainer, sampler
    fresh = lambda ds: ds if len(ds) == topology.chips else topology_devices(  # noqa: E731
        sub_topology(topology, len(ds)))
    return fresh(trainer), (fresh(sampler) if sampler is not trainer else None)
  return split


def abstract_run(config, devices, topology=None) -> AbstractRun:
  """The run of a validated `config` on `devices` (a slice's compile-only devices, of
  `topology`).

  Raises:
    ConfigError: the prompt columns cannot be derived (the task's data cannot be loaded
      here: set plan.prompt_len).
    TopologyError: a share of the slice that is no slice of its own.
  """
  mesh, sampler_mesh = meshes(config, devices, split=_split(topology))
  shards = parallel.batch_shards(mesh)
  try:
    model_cfg, tokenizer, task = model_and_tokenizer(config)
    prompt_len = prompt_columns(config, model_cfg, tokenizer, task)
  except (OSError, ImportError, RuntimeError) as err:
    raise ConfigError(f"plan.prompt_len=0 needs the task's prompts and tokenizer, which "
                      f"failed to load ({type(err).__name__}: {err}); set plan.prompt_len") from err
  specs = build_specs(config, model_description=repr(model_cfg),
                      pack_groups=shards if config.algo.pack_sequences else 0)
  params = _params(config, model_cfg, mesh, specs)
  notes = []
  teacher = teacher_cfg = None
  if config.algo.distill_teacher:
    teacher_cfg = teacher_config(config)
    if teacher_cfg is None:
      notes.append(f"teacher: {distill_teacher_dir(config)} is not there yet; not planned")
    else:
      graphdef, tparams = abstract_module(lambda: Decoder(teacher_cfg, rngs=nnx.Rngs(0)), mesh)
      teacher = Teacher(graphdef=graphdef, params=tparams, source=distill_teacher_dir(config))
  return AbstractRun(config=config, specs=specs, model_cfg=model_cfg, mesh=mesh,
                     sampler_mesh=sampler_mesh, params=params, state=init_state(params),
                     teacher=teacher, shapes=_shapes(config, specs, prompt_len,
                                                     sampler_mesh or mesh), notes=notes,
                     teacher_cfg=teacher_cfg)


def per_chip_bytes(tree, *, device_only: bool = True) -> float:
  """Bytes of `tree`'s abstract leaves held by one device (the largest shard), summed;
  leaves in a host memory space are skipped with `device_only`."""
  total = 0
  for x in jax.tree.leaves(tree):
    s = x.sharding
    if device_only and str(getattr(s, "memory_kind", "") or "").endswith("_host"):
      continue
    total += math.prod(s.shard_shape(x.shape)) * jnp.dtype(x.dtype).itemsize
  return float(total)
