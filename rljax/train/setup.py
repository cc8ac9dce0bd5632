"""Build everything a run needs from a validated config (once, before the loop)."""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from flax import nnx

from rljax import parallel
from rljax.data import sources
from rljax.data.batching import bucket_length
from rljax.data.jsonl_task import JsonlTask
from rljax.data.python_task import load_python_task
from rljax.data.records_task import RecordsTask
from rljax.data.samplers import make_sampler
from rljax.data.tasks import make_task
from rljax.data.tokenizers import DEFAULT_TAGS, CharTokenizer, HFTokenizer, check_vocab
from rljax.models import Decoder, ModelConfig, add_lora, load_hf
from rljax.models.heads import ValueModel
from rljax.rewards.base import compose
from rljax.rewards.reward_model import RewardModelScorer, load_reward_model
from rljax.rewards.user import user_reward_terms
from rljax.sampling import SamplingParams
from rljax.train import advantages, objective, offload, update
from rljax.train.rollout import RolloutContext, prompt_ids
from rljax.train.validate import ConfigError


@dataclasses.dataclass
class Setup:
  config: object
  tokenizer: object
  task: object
  model_cfg: ModelConfig
  actor_graphdef: object
  critic_graphdef: object
  mesh: object
  ctx: RolloutContext
  loss_spec: objective.LossSpec
  adv_spec: advantages.AdvantageSpec
  actor_tx: object
  critic_tx: object
  num_micro: int
  update_step: object         # set by `compile_update` once the state is placed
  initial_actor: object       # nnx.State
  initial_critic: object      # nnx.State or None
  prompt_sampler: object      # rljax.data.samplers: uniform | curriculum | prioritized
  prompt_index: dict          # prompt id -> index into task.train_prompts()


def build_task(config):
  t = config.task
  if t.name == "python":
    return load_python_task(t.python, n_heldout=t.heldout_size)
  if t.name in ("jsonl", "hf_dataset", "tfds"):
    fields = dict(prompt_field=t.prompt_field, answer_field=t.answer_field,
                  solution_field=t.solution_field)
    options = dict(fields, answer_extractor=t.answer_extractor, answer_regex=t.answer_regex,
                   prompt_template=t.prompt_template, n_heldout=t.heldout_size,
                   format_weight=t.format_weight)
    if t.name == "jsonl":
      return JsonlTask(t.jsonl_path, **options)
    if t.name == "hf_dataset":
      rows = sources.load_hf_rows(t.hf_path, split=t.hf_split, config=t.hf_config,
                                  columns=list(fields.values()))
      return RecordsTask(rows, source=f"{t.hf_path}[{t.hf_split}]", **options)
    rows = sources.load_tfds_rows(t.tfds_name, split=t.tfds_split, data_dir=t.tfds_data_dir,
                                  columns=list(fields.values()))
    return RecordsTask(rows, source=f"{t.tfds_name}[{t.tfds_split}]", **options)
  hi = t.difficulty_max or t.difficulty
  options = ({"digits": t.digits, "scratchpad_fraction": t.scratchpad_fraction}
             if t.name == "arithmetic" else
             {"digits": t.digits, "tool_fraction": t.scratchpad_fraction}
             if t.name == "calculator" else {})
  return make_task(t.name, difficulty=(t.difficulty, hi), seed=t.seed, n_heldout=t.heldout_size,
                   format_weight=t.format_weight, **options)


def task_rewards(task, config, tokenizer, max_tokens):
  """The run's reward: the task's verifier (accuracy + weighted format; a user task's own
  score), a reward model, and `task.reward_fns`, composed with failure containment.

  `accuracy` and `format` are always components (the metrics, the held-out evaluation and
  dynamic sampling read them); with `task.reward_fns` in "replace" mode they get weight 0.
  """
  t = config.task
  # One verifier call per sample feeds every term (math verification can be expensive).
  score = functools.lru_cache(maxsize=4096)(task.score)
  verifier = not t.reward_fns or t.reward_fns_mode == "add"
  terms = []
  if t.name == "python":
    terms.append(("task", lambda p, c: score(p, c)["total"], 1.0 if verifier else 0.0))
    terms += [("accuracy", lambda p, c: score(p, c)["accuracy"], 0.0),
              ("format", lambda p, c: score(p, c)["format"], 0.0)]
  else:
    terms += [("accuracy", lambda p, c: score(p, c)["accuracy"], 1.0 if verifier else 0.0),
              ("format", lambda p, c: score(p, c)["format"],
               t.format_weight if verifier else 0.0)]
  if t.reward_model_path:
    scorer = RewardModelScorer.from_checkpoint(t.reward_model_path, tokenizer)
    scorer.warmup(max_tokens)   # compile before the per-call deadline applies
    terms.append(("reward_model", scorer, t.reward_model_weight))
  taken = {name for name, _, _ in terms}
  for name, fn, weight in user_reward_terms(list(t.reward_fns), list(t.reward_weights)):
    terms.append((f"user_{name}" if name in taken else name, fn, weight))
  return compose(terms, on_failure=t.reward_on_failure, timeout=t.reward_timeout or None)


def prompt_length(config, task, tokenizer, max_positions):
  """Prompt columns P (a shape bucket) such that P + max_new_tokens fits the model.

  Prompts longer than that are rejected with an error naming one of them, or left-truncated
  (their last tokens kept) when task.long_prompts == "truncate".
  """
  limit = max_positions - config.sampling.max_new_tokens
  prompts = task.train_prompts() + task.heldout_prompts()
  chat = config.task.chat_template
  lengths = [len(prompt_ids(tokenizer, p.text, chat_template=chat)) for p in prompts]
  too_long = [p.id for p, n in zip(prompts, lengths) if n > limit]
  if too_long and config.task.long_prompts == "reject":
    raise ConfigError(
        f"{len(too_long)} prompts (e.g. {too_long[0]}) are longer than {limit} tokens = model "
        f"positions {max_positions} - sampling.max_new_tokens; set task.long_prompts='truncate' "
        "to keep their last tokens, or shorten them")
  return min(bucket_length(max(lengths)), limit)


def tiny_model_config(config, vocab_size) -> ModelConfig:
  m = config.model
  return ModelConfig(
      vocab_size=m.vocab_size or vocab_size, hidden_size=m.hidden_size,
      intermediate_size=m.intermediate_size, num_layers=m.num_layers, num_heads=m.num_heads,
      num_kv_heads=m.num_kv_heads, head_dim=m.head_dim, rope_theta=m.rope_theta,
      max_position_embeddings=m.max_position_embeddings, tie_embeddings=m.tie_embeddings,
      dtype=m.dtype, param_dtype=m.param_dtype, remat=m.remat, arch="qwen2")


def build_models(config, tokenizer):
  """(actor, critic or None, model config). HF checkpoints or a tiny random decoder."""
  rngs = nnx.Rngs(config.run.seed)
  if config.model.hf_path:
    actor, model_cfg = load_hf(config.model.hf_path, dtype=config.model.dtype)
  else:
    model_cfg = tiny_model_config(config, tokenizer.vocab_size)
    actor = Decoder(model_cfg, rngs=rngs)
  check_vocab(tokenizer, model_cfg.vocab_size)
  m = config.model
  if m.lora_rank:
    add_lora(actor, rank=m.lora_rank, alpha=m.lora_alpha, targets=tuple(m.lora_targets),
             rngs=nnx.Rngs(config.run.seed + 3))
  critic = None
  if config.algo.advantage == "gae" and config.algo.critic_init_path:
    critic = ValueModel.from_reward_model(load_reward_model(config.algo.critic_init_path))
  elif config.algo.advantage == "gae":
    critic = ValueModel(model_cfg, rngs=nnx.Rngs(config.run.seed + 1))
  return actor, critic, model_cfg


def optimizer(config, lr):
  o = config.optim
  return update.make_optimizer(lr, warmup_steps=o.warmup_steps, weight_decay=o.weight_decay,
                               b1=o.b1, b2=o.b2, grad_clip=o.grad_clip)


def episode_config(config, tokenizer, sampling):
  """The multi-turn settings of a run with `task.env` (None without)."""
  t, s = config.task, config.sampling
  if not t.env:
    return None
  from rljax.envs import load_env_factory
  from rljax.train.multiturn import EpisodeConfig, turn_spec
  return EpisodeConfig(
      factory=load_env_factory(t.env),
      spec=turn_spec(tokenizer, sampling, list(s.turn_stop), int(s.max_observation_tokens)),
      max_turns=int(s.max_turns),
      max_observation_tokens=int(s.max_observation_tokens),
      timeout=float(t.env_timeout) or None, reward_only=bool(t.env_reward_only))


def build(config) -> Setup:
  """Tokenizer, task, models, mesh, sampling params, specs, optimizers, update step."""
  task = build_task(config)
  tokenizer = (HFTokenizer(config.model.hf_path) if config.model.hf_path else
               CharTokenizer(tags=DEFAULT_TAGS + tuple(getattr(task, "tags", ()))))
  actor, critic, model_cfg = build_models(config, tokenizer)
  prompt_len = prompt_length(config, task, tokenizer, model_cfg.max_position_embeddings)
  p = config.parallel
  devices = parallel.select_devices(p.num_devices)
  mesh = parallel.make_mesh(data=p.data, fsdp=p.fsdp, tensor=p.tensor, devices=devices)
  parallel.shard_model(actor, mesh)
  if critic is not None:
    parallel.shard_model(critic, mesh)
  s = config.sampling
  sampling = SamplingParams(max_new_tokens=s.max_new_tokens, temperature=s.temperature,
                            top_k=s.top_k, top_p=s.top_p, min_p=s.min_p, n=s.n,
                            stop_tokens=(tokenizer.eos_id,))
  reward_fn = task_rewards(task, config, tokenizer, prompt_len + s.max_new_tokens + 1)
  ctx = RolloutContext(task=task, tokenizer=tokenizer, prompt_len=prompt_len, sampling=sampling,
                       reward_fn=reward_fn, chat_template=config.task.chat_template, mesh=mesh,
                       continuous=bool(s.continuous), slots=int(s.slots),
                       share_prefill=bool(s.share_prefill),
                       episodes=episode_config(config, tokenizer, sampling))
  actor_graphdef, actor_state = nnx.split(actor)
  critic_graphdef, critic_state = nnx.split(critic) if critic is not None else (None, None)
  data_shards = math.prod(mesh.shape[a] for a in parallel.BATCH_AXES if a in mesh.axis_names)
  spec = objective.loss_spec(config, data_shards if config.algo.pack_sequences else 0)
  actor_tx = optimizer(config, config.optim.actor_lr)
  critic_tx = optimizer(config, config.optim.critic_lr)
  prompts = task.train_prompts()
  sampler_options = ({"ramp_steps": config.task.curriculum_steps}
                     if config.task.prompt_sampler == "curriculum" else {})
  prompt_sampler = make_sampler(config.task.prompt_sampler, prompts, seed=config.run.seed,
                                **sampler_options)
  return Setup(prompt_sampler=prompt_sampler,
               prompt_index={p.id: i for i, p in enumerate(prompts)}, config=config, tokenizer=tokenizer, task=task, model_cfg=model_cfg,
               actor_graphdef=actor_graphdef, critic_graphdef=critic_graphdef, mesh=mesh, ctx=ctx,
               loss_spec=spec, adv_spec=advantages.advantage_spec(config, reward_fn), actor_tx=actor_tx,
               critic_tx=critic_tx, num_micro=config.algo.microbatches, update_step=None,
               initial_actor=actor_state,
               initial_critic=critic_state)


def compile_update(setup: Setup, state) -> None:
  """Builds the update step with the shardings of the placed `state` as its output shardings."""
  shardings = jax.tree.map(lambda x: x.sharding, state)
  setup.update_step = update.build_update_step(
      setup.loss_spec, setup.actor_graphdef, setup.critic_graphdef, setup.actor_tx,
      setup.critic_tx, setup.num_micro, state_shardings=shardings, mesh=setup.mesh)


def split_lora(setup: Setup, actor_params):
  """(trainable, frozen base or None): the LoRA adapters and the rest of a LoRA actor's
  full parameters; (all of them, None) for full fine-tuning."""
  if not setup.config.model.lora_rank:
    return actor_params, None
  return nnx.split_state(actor_params, nnx.LoRAParam, ...)


def init_state(setup: Setup, actor_params, *, with_reference: bool) -> update.TrainState:
  """A fresh TrainState around (possibly SFT-initialised) actor parameters, placed on the mesh
  (the reference copy in host memory when `algo.reference_offload`).

  With LoRA, `actor` holds the adapters and `base` the frozen rest; the optimizer state
  covers the adapters only, and there is no reference copy (the base is the reference).
  """
  c = setup.config
  critic = setup.initial_critic
  copy = lambda tree: jax.tree.map(jnp.copy, tree)  # noqa: E731
  init_opt = update.init_optimizer_state
  actor_params, base = split_lora(setup, actor_params)
  with_reference = with_reference and base is None
  state = update.TrainState(
      step=jnp.zeros((), jnp.int32), iteration=jnp.zeros((), jnp.int32),
      actor=actor_params, actor_opt=init_opt(setup.actor_tx, actor_params),
      critic=critic, critic_opt=init_opt(setup.critic_tx, critic) if critic is not None else None,
      base=base,
      ref=copy(actor_params) if with_reference else None,
      kl_coef=jnp.asarray(c.algo.kl_coef, jnp.float32),
      rng=jax.random.key_data(jax.random.key(c.run.seed)),
      skipped_updates=jnp.zeros((), jnp.int32), nonfinite_in_row=jnp.zeros((), jnp.int32))
  state = update.place_state(state, setup.mesh)
  # .get: config.json of runs saved before the option existed (rljax eval --run) lacks it.
  if with_reference and c.algo.get("reference_offload", False):
    state = state._replace(ref=offload.to_host(state.ref))   # host memory between uses
  return state
