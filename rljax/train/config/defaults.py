"""The one base config, generated from the concerns' dataclasses, and the values derived
from a config. Experiment files state only what differs from the base config.

Its field names are the public override API (`--config.algo.eps_high=0.28`); each is
declared once, with its default, doc and checks, in `rljax.train.config.groups`,
`rljax.train.config.task` and `rljax.train.config.algo`.
"""

from __future__ import annotations

import dataclasses

from ml_collections import ConfigDict

from rljax.models.presets import hf_config_dict
from rljax.train.config.algo import algo_section
from rljax.train.config.fields import section
from rljax.train.config.groups import SFT, EvalSetSpec, Model, Optim, Parallel, Plan, RunSpec
from rljax.train.config.task import Sampling, Task

EVAL_SET_FIELDS = tuple(f.name for f in dataclasses.fields(EvalSetSpec) if f.name != "name")


def base_config() -> ConfigDict:
  """Every field rljax reads, with defaults for the embedded default run (GRPO)."""
  # heldout: size 0 = task.heldout_size; k / temperature None = sampling.eval_n / _temperature
  heldout = eval_set(size=0, temperature=None, k=None)
  return ConfigDict(dict(
      run=section(RunSpec), model=section(Model), task=section(Task), sft=section(SFT),
      sampling=section(Sampling), algo=algo_section(), optim=section(Optim),
      parallel=section(Parallel), eval=ConfigDict(dict(sets=ConfigDict(dict(heldout=heldout)))),
      plan=section(Plan)))


def eval_set(source: str = "heldout", **fields) -> ConfigDict:
  """One entry of `eval.sets` (`c.eval.sets.hard = eval_set("arithmetic:5", k=8)`): fields
  `size`, `greedy`, `temperature`, `k` as `rljax.train.config.groups.EvalSetSpec` declares them.

  Args:
    source: "heldout" (the task's held-out split) | "NAME" or "NAME:LEVEL" (the held-out
      prompts of a synthetic task, e.g. "arithmetic:5" = 6-term chains) | a JSONL file
      ("*.jsonl", rows {"prompt", "answer"}).
  """
  defaults = {f.name: f.default for f in dataclasses.fields(EvalSetSpec)} | {"source": source}
  unknown = sorted(set(fields) - set(EVAL_SET_FIELDS))
  if unknown:
    raise TypeError(f"eval_set() got unknown fields {unknown}; its fields: {EVAL_SET_FIELDS}")
  return ConfigDict({k: fields.get(k, defaults[k]) for k in EVAL_SET_FIELDS})


def resolved_eval_sets(config) -> dict:
  """{name: {source, size, greedy, temperature, k}} of `eval.sets`: fields an entry leaves
  out take `eval_set()`'s defaults, and the `heldout` entry's None k / temperature are
  `sampling.eval_n` / `sampling.eval_temperature`. Derived here once; nothing is written back."""
  out = {}
  for name, entry in config.eval.sets.items():
    fields = dict(eval_set().to_dict(), **(entry.to_dict() if hasattr(entry, "to_dict") else {}))
    if fields["k"] is None:
      fields["k"] = config.sampling.eval_n
    if fields["temperature"] is None:
      fields["temperature"] = config.sampling.eval_temperature
    out[name] = fields
  return out


def distill_teacher_dir(config) -> str:
  """`algo.distill_teacher` with "{seed}" replaced by `run.seed` ("" when off)."""
  return str(config.algo.distill_teacher).replace("{seed}", str(config.run.seed))


def _hf_config(config) -> dict | None:
  """The config.json of `model.hf_config` (a preset or a path) or of `model.hf_path`, when
  set and readable (validation reports an unreadable hf_config)."""
  source = config.model.hf_config or config.model.hf_path
  try:
    return hf_config_dict(source) if source else None
  except ValueError:
    return {}


def model_positions(config) -> int:
  """The policy's position limit: `max_position_embeddings` of its Hugging Face config when
  it has one, else `model.max_position_embeddings`."""
  hf = _hf_config(config)
  return int(hf.get("max_position_embeddings", 4096) if hf
             else config.model.max_position_embeddings)


def policy_experts(config) -> int:
  """E, the routed experts of the policy's MoE layers (0 for a dense policy)."""
  hf = _hf_config(config)
  if hf is None:
    return int(config.model.num_experts)
  return int(hf.get("num_experts", hf.get("num_local_experts")) or 0)


def completion_columns(config) -> int:
  """T, the rollout rows' completion columns: `sampling.max_total_tokens` (the whole
  episode: sampled and observation tokens) for a multi-turn run that sets it, else
  `sampling.max_new_tokens`. The one derived length; nothing writes it back."""
  s = config.sampling
  if config.task.env and s.max_total_tokens > 0:
    return int(s.max_total_tokens)
  return int(s.max_new_tokens)
