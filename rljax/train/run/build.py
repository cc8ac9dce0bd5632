"""Build everything a run needs from a validated config (once, before the loop).

`build(config) -> Setup` is where the ConfigDict ends: the specs, the task and its reward,
the tokenizer, the models on their mesh (`Params`), the rollouts (single-turn or
episodic, chosen here), the prompt sampler. Nothing after it reads the config.
"""

from __future__ import annotations

import dataclasses
import functools

from flax import nnx

from rljax import parallel
from rljax.data.samplers import make_sampler
from rljax.data.tasks import WORKED_OPTIONS, make_task
from rljax.envs import load_env_factory
from rljax.models import ModelConfig
from rljax.sampling import SamplingParams
from rljax.train.config.specs import Specs, build_specs
from rljax.train.params import Params
from rljax.train.rollout import RolloutContext, make_rollouts
from rljax.train.rollout.evaluate import EvalSet, eval_context, overlap_warning
from rljax.train.rollout.train_batches import TrainBatches
from rljax.train.run.task_and_models import (
    build_models,
    build_task,
    build_teacher,
    build_tokenizer,
    eval_set_task,
    optimizer,
    prompt_length,
    task_rewards,
    verifier_reward,
)
from rljax.train.update.advantages import gdpo_terms


@dataclasses.dataclass
class Setup:
  """What `build` makes of a config: the specs and the objects the loop works with.

  Attributes:
    rollouts: the run's `SingleTurn` or `Episodic` rollout (its `ctx` has the task,
      tokenizer, prompt columns, sampling parameters, reward and mesh).
    ood: (rollouts, prompts) of the out-of-distribution evaluation split, or None.
    prompt_sampler: uniform | curriculum | prioritized (`rljax.data.samplers`).
    config_json: the resolved config, written to the run directory.
    eval_sets: the named evaluation sets of `eval.sets` besides `heldout` (`EvalSet`s).
  """

  specs: Specs
  task: object
  tokenizer: object
  model_cfg: ModelConfig
  params: Params
  rollouts: object
  ood: object
  prompt_sampler: object
  mesh: object
  config_json: str
  eval_sets: tuple = ()

  @property
  def ctx(self) -> RolloutContext:
    return self.rollouts.ctx

  @functools.cached_property
  def batches(self) -> TrainBatches:
    """What samples the training batches (the rollouts, the prompt sampler, the seed)."""
    return TrainBatches(self.rollouts, self.prompt_sampler, self.specs.rollout,
                        seed=self.specs.run.seed, sample_stream=self.specs.run.sample_stream)

  def heldout_prompts(self) -> list:
    """The held-out prompts evaluated: the task's split, its first `eval.sets.heldout.size`
    when that is set."""
    return self.task.heldout_prompts()[:self.specs.rollout.eval_size or None]


def meshes(config, devices=None, *, split=parallel.split_devices):
  """(the trainer's mesh, the sampler's mesh or None when it shares the trainer's), over
  `devices` (default: all of this host's; `rljax plan`: a TPU slice's compile-only ones,
  with its own `split(devices, sampler_count) -> (trainer, sampler devices)`)."""
  p = config.parallel
  trainer, sampler = split(parallel.select_devices(p.num_devices, devices), p.sampler_devices)
  mesh = parallel.make_mesh(data=p.data, fsdp=p.fsdp, tensor=p.tensor, expert=p.expert,
                            devices=trainer)
  if not p.sampler_devices:
    return mesh, None
  return mesh, parallel.make_mesh(data=-1, tensor=p.sampler_tensor, devices=sampler)


def _params(config, actor, critic, mesh, specs: Specs, sampler_mesh=None,
            teacher=None) -> Params:
  parallel.shard_model(actor, mesh)
  if critic is not None:
    parallel.shard_model(critic, mesh)
  actor_graphdef, actor_state = nnx.split(actor)
  critic_graphdef, critic_state = nnx.split(critic) if critic is not None else (None, None)
  return Params(
      actor_graphdef=actor_graphdef, critic_graphdef=critic_graphdef,
      initial_actor=actor_state, initial_critic=critic_state,
      actor_tx=optimizer(config, config.optim.actor_lr),
      critic_tx=optimizer(config, config.optim.critic_lr), mesh=mesh,
      sources=specs.sources, seed=specs.run.seed, lora=bool(config.model.lora_rank),
      critic_from_policy=not config.algo.critic_init_path, sampler_mesh=sampler_mesh,
      teacher=teacher)


def _ood(config, rollouts):
  """(rollouts, prompts) of the `task.ood_difficulty` split (more terms than trained: the
  "RL generalises, SFT memorises" check of Chu et al. 2025, arXiv:2501.17161), or None.
  Its budget fits the split's worked solutions, so a longer reasoning mode is not cut off
  by the training budget."""
  t = config.task
  if not t.ood_difficulty:
    return None
  options = {"digits": t.digits} if t.name == "arithmetic" else {}
  task = make_task(t.name, difficulty=t.ood_difficulty, seed=t.seed, n_heldout=t.heldout_size,
                   format_weight=t.format_weight, **options)
  ctx = rollouts.ctx
  budget = max(ctx.sampling.max_new_tokens, task.max_completion_len + 1)
  ctx = ctx.replace(task=task, prompt_len=max(ctx.prompt_len, task.max_prompt_len + 1),
                    sampling=ctx.sampling.replace(max_new_tokens=budget))
  return rollouts.with_context(ctx), task.heldout_prompts()


def _eval_sets(config, specs: Specs, rollouts, max_positions) -> tuple:
  """The named evaluation sets (`eval.sets`): each source's prompts, scored by its own
  verifier, with prompt columns and a budget that fit it (at least the run's budget); a
  warning for a set that shares prompts with training (`overlap_warning`)."""
  sets = []
  for spec in specs.eval_sets:
    task, prompts, budget = eval_set_task(config, spec, rollouts.ctx.task)
    warning = overlap_warning(spec.name, prompts, rollouts.ctx.task.train_prompts())
    if warning:
      print(warning)
    set_rollouts = rollouts
    if task is not rollouts.ctx.task:
      ctx = eval_context(rollouts.ctx, task, prompts, verifier_reward(task, config),
                         budget=max(specs.rollout.max_new_tokens, budget),
                         max_positions=max_positions)
      set_rollouts = rollouts.with_context(ctx)
    sets.append(EvalSet(spec=spec, rollouts=set_rollouts, prompts=tuple(prompts)))
  return tuple(sets)


def _rollouts(config, task, tokenizer, prompt_len, mesh, specs: Specs):
  s = specs.rollout
  sampling = SamplingParams(max_new_tokens=s.max_new_tokens, temperature=s.temperature,
                            top_k=s.top_k, top_p=s.top_p, min_p=s.min_p, n=s.n,
                            stop_tokens=(tokenizer.eos_id,))
  reward_fn = task_rewards(task, config, tokenizer, prompt_len + s.max_new_tokens + 1)
  ctx = RolloutContext(task=task, tokenizer=tokenizer, prompt_len=prompt_len,
                       sampling=sampling, reward_fn=reward_fn,
                       chat_template=bool(config.task.chat_template), mesh=mesh,
                       sampler_dtype=s.sampler_dtype,
                       # synthetic tasks with a worked mode (arithmetic, calculator)
                       worked_demonstrations=bool(set(WORKED_OPTIONS)
                                                  & set(getattr(task, "options", {}))))
  factory = load_env_factory(config.task.env) if config.task.env else None
  return make_rollouts(ctx, s, env_factory=factory)


def build(config) -> Setup:
  """Tokenizer, task, models, mesh, specs, rollouts and prompt sampler of a validated config."""
  task = build_task(config)
  tokenizer = build_tokenizer(config, task)
  actor, critic, model_cfg = build_models(config, tokenizer)
  prompt_len = prompt_length(config, task, tokenizer,
                                        model_cfg.max_position_embeddings)
  mesh, sampler_mesh = meshes(config)
  shards = parallel.batch_shards(mesh)
  specs = build_specs(config, model_description=repr(model_cfg),
                      pack_groups=shards if config.algo.pack_sequences else 0)
  rollouts = _rollouts(config, task, tokenizer, prompt_len, sampler_mesh or mesh, specs)
  if config.algo.reward_aggregation == "normalize_then_sum":   # GDPO's reward weights
    specs = dataclasses.replace(specs, advantage=dataclasses.replace(
        specs.advantage, reward_weights=gdpo_terms(rollouts.ctx.reward_fn)[1]))
  prompts = task.train_prompts()
  sampler_options = ({"ramp_steps": config.task.curriculum_steps}
                     if config.task.prompt_sampler == "curriculum" else {})
  teacher = build_teacher(config, tokenizer, model_cfg.vocab_size, mesh)
  return Setup(
      specs=specs, task=task, tokenizer=tokenizer, model_cfg=model_cfg,
      params=_params(config, actor, critic, mesh, specs, sampler_mesh, teacher),
      rollouts=rollouts,
      ood=_ood(config, rollouts),
      prompt_sampler=make_sampler(config.task.prompt_sampler, prompts, seed=config.run.seed,
                                  **sampler_options),
      mesh=mesh,
      config_json=config.to_json_best_effort(indent=2, sort_keys=True),
      eval_sets=_eval_sets(config, specs, rollouts, model_cfg.max_position_embeddings))

