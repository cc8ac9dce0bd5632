"""What `rljax.train.run.build` makes of the config besides the specs: the task, its reward
and tokenizer, the prompt columns, the models (policy, value model, distillation teacher)
and their optimizers.

With `rljax.train.run.build` and `rljax.train.config.specs`, the only code after loading
that reads the ConfigDict.
"""

from __future__ import annotations

import functools
import pathlib

from flax import nnx

from rljax import parallel
from rljax.data import sources
from rljax.data.batching import bucket_length
from rljax.data.jsonl_task import JsonlTask
from rljax.data.python_task import load_python_task
from rljax.data.records_task import RecordsTask
from rljax.data.tasks import make_task
from rljax.data.tokenizers import DEFAULT_TAGS, CharTokenizer, HFTokenizer, check_vocab
from rljax.models import Decoder, ModelConfig, add_lora, config_from_hf, load_hf
from rljax.models.heads import ValueModel
from rljax.models.presets import hf_config_dict
from rljax.rewards.base import compose
from rljax.rewards.reward_model import RewardModelScorer, load_reward_model
from rljax.rewards.user import user_reward_terms
from rljax.train.config import ConfigError, completion_columns, saved_config
from rljax.train.config.defaults import distill_teacher_dir
from rljax.train.params import Teacher, make_optimizer
from rljax.train.params.teacher import is_run_dir, restore_run_params, vocabulary
from rljax.train.rollout import prompt_ids


def build_task(config):
  """The task object of `task.name` (synthetic, a data source, or the user's own)."""
  t = config.task
  if t.name == "python":
    return load_python_task(t.python, n_heldout=t.heldout_size)
  if t.name in ("jsonl", "hf_dataset", "tfds"):
    fields = dict(prompt_field=t.prompt_field, answer_field=t.answer_field,
                  solution_field=t.solution_field)
    options = dict(_record_options(t), n_heldout=t.heldout_size)
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


def _record_options(t) -> dict:
  """RecordsTask options of the `task` group (fields, answer extraction, template)."""
  return dict(prompt_field=t.prompt_field, answer_field=t.answer_field,
              solution_field=t.solution_field, answer_extractor=t.answer_extractor,
              answer_regex=t.answer_regex, prompt_template=t.prompt_template,
              format_weight=t.format_weight)


def eval_set_task(config, spec, run_task):
  """(task, prompts, completion budget or 0) of a named evaluation set's source: the run's
  held-out split, a JSONL file (all its rows, fields as `task.*`), or the held-out prompts
  of a synthetic task at a level (seeded by `task.seed`; its budget fits its worked
  solutions, as the `task.ood_difficulty` split's does)."""
  t = config.task
  if spec.source == "heldout":
    return run_task, run_task.heldout_prompts()[:spec.size or None], 0
  if spec.source.endswith(".jsonl"):
    task = JsonlTask(spec.source, **_record_options(t))
    return task, (task.train_prompts() + task.heldout_prompts())[:spec.size or None], 0
  name, _, level = spec.source.partition(":")
  difficulty = int(level) if level else (t.difficulty, t.difficulty_max or t.difficulty)
  options = {"digits": t.digits} if name in ("arithmetic", "calculator") else {}
  task = make_task(name, difficulty=difficulty, seed=t.seed, n_heldout=spec.size or t.heldout_size,
                   format_weight=t.format_weight, **options)
  return task, task.heldout_prompts(), task.max_completion_len + 1


def verifier_reward(task, config):
  """A task's own verifier as a reward (accuracy + weighted format), for evaluation sets."""
  t = config.task
  score = functools.lru_cache(maxsize=4096)(task.score)
  return compose([("accuracy", lambda p, c: score(p, c)["accuracy"], 1.0),
                  ("format", lambda p, c: score(p, c)["format"], t.format_weight)],
                 on_failure=t.reward_on_failure, timeout=t.reward_timeout or None)


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
  if getattr(getattr(task, "spec", None), "worked", None) is not None:
    # the share of completions in the task's worked mode (scratchpad, tool call): logged
    terms.append(("worked", lambda p, c: task.worked(c), 0.0))
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
  limit = max_positions - completion_columns(config)
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


def build_tokenizer(config, task):
  """The checkpoint's tokenizer (`model.hf_path`), else the character tokenizer with the
  task's tags as single tokens."""
  if config.model.hf_path:
    return HFTokenizer(config.model.hf_path)
  return CharTokenizer(tags=DEFAULT_TAGS + tuple(getattr(task, "tags", ())))


def tiny_model_config(config, vocab_size) -> ModelConfig:
  """The decoder of the `model` group's fields (no `model.hf_path`)."""
  m = config.model
  return ModelConfig(
      vocab_size=m.vocab_size or vocab_size, hidden_size=m.hidden_size,
      intermediate_size=m.intermediate_size, num_layers=m.num_layers, num_heads=m.num_heads,
      num_kv_heads=m.num_kv_heads, head_dim=m.head_dim, rope_theta=m.rope_theta,
      max_position_embeddings=m.max_position_embeddings, tie_embeddings=m.tie_embeddings,
      dtype=m.dtype, param_dtype=m.param_dtype, remat=m.remat, attention=m.attention,
      scan_layers=m.scan_layers, arch="qwen2", **tiny_moe_fields(m))


def tiny_moe_fields(m) -> dict:
  """The tiny decoder's mixture-of-experts fields ({} for a dense one)."""
  if not m.get("num_experts", 0):
    return {}
  return dict(num_experts=m.num_experts, num_experts_per_tok=m.num_experts_per_tok,
              moe_intermediate_size=m.moe_intermediate_size, norm_topk_prob=True,
              decoder_sparse_step=m.moe_sparse_step)


def model_config(config, vocab_size) -> ModelConfig:
  """The policy's architecture: a checkpoint's config.json (`model.hf_path`), a preset's or a
  config.json's shapes (`model.hf_config`), or the tiny decoder's fields; the `model`
  group's dtype, param_dtype, remat and attention apply to all three. No weights are
  read."""
  m = config.model
  if m.hf_path or m.hf_config:
    return config_from_hf(hf_config_dict(m.hf_path or m.hf_config), dtype=m.dtype,
                          param_dtype=m.param_dtype).replace(remat=bool(m.remat),
                                                             attention=m.attention,
                                                             scan_layers=bool(m.scan_layers))
  return tiny_model_config(config, vocab_size)


def with_config(model, cfg: ModelConfig):
  """`model`'s parameters in a `Decoder` built from `cfg` (same shapes, e.g. remat on, another
  attention path)."""
  if model.cfg == cfg:
    return model
  rebuilt = nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0)))
  nnx.update(rebuilt, nnx.state(model))
  return rebuilt


def add_lora_of(config, model):
  """`model` with the `model.lora_*` adapters (in place; none with lora_rank 0)."""
  m = config.model
  if m.lora_rank:
    add_lora(model, rank=m.lora_rank, alpha=m.lora_alpha, targets=tuple(m.lora_targets),
             rngs=nnx.Rngs(config.run.seed + 3))
  return model


def build_models(config, tokenizer):
  """(actor, critic or None, model config): a checkpoint's weights, or random ones."""
  model_cfg = model_config(config, tokenizer.vocab_size)
  if config.model.hf_path:
    actor, _ = load_hf(config.model.hf_path, dtype=model_cfg.dtype,
                       param_dtype=model_cfg.param_dtype, scan_layers=model_cfg.scan_layers)
    actor = with_config(actor, model_cfg)
  else:
    actor = Decoder(model_cfg, rngs=nnx.Rngs(config.run.seed))
  check_vocab(tokenizer, model_cfg.vocab_size)
  add_lora_of(config, actor)
  critic = None
  if config.algo.advantage == "gae" and config.algo.critic_init_path:
    critic = ValueModel.from_reward_model(load_reward_model(config.algo.critic_init_path))
  elif config.algo.advantage == "gae":
    critic = ValueModel(model_cfg, rngs=nnx.Rngs(config.run.seed + 1))
  return actor, critic, model_cfg


def optimizer(config, lr):
  """AdamW of the optim group at learning rate `lr`."""
  o = config.optim
  return make_optimizer(lr, warmup_steps=o.warmup_steps, weight_decay=o.weight_decay,
                               b1=o.b1, b2=o.b2, grad_clip=o.grad_clip)


def _teacher_module(teacher_config, tokenizer, dtype, attention):
  """The model of an rljax run's config (its own width and depth; LoRA adapters when it
  trained some), its parameters in `dtype` ("": the run's own), attending by `attention`
  (the student run's `model.attention`: the devices are this run's)."""
  m = teacher_config.model
  if m.hf_path:
    model, _ = load_hf(m.hf_path, dtype=dtype or m.dtype, param_dtype=dtype or None,
                       attention=attention)
  else:
    model_cfg = tiny_model_config(teacher_config, tokenizer.vocab_size).replace(
        attention=attention)
    if dtype:
      model_cfg = model_cfg.replace(dtype=dtype, param_dtype=dtype)
    model = Decoder(model_cfg, rngs=nnx.Rngs(0))
  if m.lora_rank:
    add_lora(model, rank=m.lora_rank, alpha=m.lora_alpha, targets=tuple(m.lora_targets),
             rngs=nnx.Rngs(0))
  return model


def _check_teacher_vocabulary(source, tokenizer, teacher_tokenizer, vocab_sizes):
  same = (vocabulary(tokenizer) == vocabulary(teacher_tokenizer) if teacher_tokenizer
          else vocab_sizes[0] == vocab_sizes[1])
  if not same:
    raise ConfigError(
        f"algo.distill_teacher={source!r}: the teacher's vocabulary differs from the "
        f"student's (model vocabularies {vocab_sizes[1]} vs {vocab_sizes[0]}); the teacher "
        "scores the student's token ids, so both must share one tokenizer")


def build_teacher(config, tokenizer, student_vocab_size: int, mesh) -> Teacher | None:
  """The frozen teacher of `algo.distill_teacher` on `mesh`, sharded like the policy (None
  without one): an rljax run's newest policy parameters, or a Hugging Face checkpoint.

  Raises:
    ConfigError: its tokenizer differs from the student's (the message names the field).
  """
  source, dtype = distill_teacher_dir(config), config.algo.distill_teacher_dtype
  if not source:
    return None
  if is_run_dir(source):
    teacher_config = saved_config(source)
    hf = teacher_config.model.hf_path
    teacher_tokenizer = build_tokenizer(teacher_config, None if hf else build_task(teacher_config))
    model = _teacher_module(teacher_config, teacher_tokenizer, dtype, config.model.attention)
  else:
    model, _ = load_hf(source, dtype=dtype or None, param_dtype=dtype or None,
                       attention=config.model.attention)
    has_tokenizer = (pathlib.Path(source) / "tokenizer_config.json").is_file()
    teacher_tokenizer = HFTokenizer(source) if has_tokenizer else None
  _check_teacher_vocabulary(source, tokenizer, teacher_tokenizer,
                            (student_vocab_size, model.cfg.vocab_size))
  graphdef, params = nnx.split(parallel.shard_model(model, mesh))
  if is_run_dir(source):
    params = restore_run_params(source, params, lora=bool(teacher_config.model.lora_rank))
  return Teacher(graphdef=graphdef, params=params, source=source)
