"""The one base config, generated from the concerns' dataclasses, its evaluation sets, and
the values derived from a config. Experiment files state only what differs from it.

Its field names are the public override API (`--config.algo.eps_high=0.28`); each is
declared once, with its default, doc and checks, in `rljax.train.config.groups` and
`rljax.train.config.algo`.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re

from ml_collections import ConfigDict

from rljax.data.tasks import TASKS
from rljax.models.presets import hf_config_dict
from rljax.train.config.algo import algo_section
from rljax.train.config.fields import ConfigError, Group, field, section
from rljax.train.config.groups import SFT, Model, Optim, Parallel, Plan, RunSpec, Sampling, Task

_SET_NAME = re.compile(r"[A-Za-z0-9_-]+")


@dataclasses.dataclass(frozen=True)
class EvalSetSpec(Group):
  """One named evaluation set of `eval.sets` (`rljax.train.config.eval_set` makes one),
  resolved; the specs hold those other than the run's own `heldout`."""

  SECTION = "eval.sets"
  name: str = field("heldout", "the set's name: `eval/<name>/...` in the logs")
  source: str = field("heldout", "heldout | NAME[:LEVEL] (a synthetic task) | a .jsonl file")
  size: int = field(128, "prompts", "int >= 0 (0: all of the source)")
  greedy: bool = field(True, "also score the greedy completion")
  temperature: float = field(1.0, "sampling temperature of the k samples", "> 0")
  k: int = field(4, "samples per prompt (avg@k, pass@1..k)", "int >= 0 (0: none)")

  @property
  def where(self) -> str:
    return f"eval.sets.{self.name}"

  def check(self, c):
    if not _SET_NAME.fullmatch(self.name):
      c.problems.append(f"{self.where}: a set name is letters, digits, '_' or '-'")
    if not isinstance(self.greedy, bool):
      c.need(False, "greedy", "must be true or false")
    elif not self.greedy and not self.k:
      c.problems.append(f"{self.where}: greedy=False and k=0 evaluate nothing")
    source, name = str(self.source), str(self.source).partition(":")[0]
    level = str(self.source).partition(":")[2]
    if source.endswith(".jsonl"):
      c.need(pathlib.Path(source).is_file(), "source", ": no such JSONL file")
    elif source != "heldout":
      c.need(name in TASKS and (not level or (level.isdigit() and int(level) >= 1)), "source",
             f"is not 'heldout', a synthetic task ({sorted(TASKS)}) with an optional "
             "':LEVEL' >= 1, or a .jsonl file")


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
  `size`, `greedy`, `temperature`, `k` as `EvalSetSpec` declares them.

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


def eval_set_problems(config) -> list[str]:
  """The problems of `eval.sets`: each entry is a group of known fields, valid once resolved;
  the held-out set keeps the run's own split."""
  errors, sets = [], config.eval.sets
  if "heldout" not in sets:
    errors.append("eval.sets.heldout is missing: it is the run's held-out result "
                  "(heldout_* in result.json)")
  for name, entry in sets.items():
    if not hasattr(entry, "keys"):
      errors.append(f"eval.sets.{name}={entry!r} must be a group "
                    "(rljax.train.config.eval_set(...))")
      continue
    unknown = sorted(set(entry.keys()) - set(EVAL_SET_FIELDS))
    if unknown:
      errors.append(f"eval.sets.{name} has unknown fields {unknown}; its fields: "
                    f"{list(EVAL_SET_FIELDS)}")
  if errors:
    return errors
  resolved = resolved_eval_sets(config)
  for name, fields in resolved.items():
    try:
      EvalSetSpec(name=name, **fields)
    except ConfigError as e:
      errors += e.problems
  held = resolved["heldout"]
  if held["source"] != "heldout" or held["greedy"] is not True:
    errors.append("eval.sets.heldout is the run's held-out result (heldout_acc_* in "
                  "result.json): it keeps source='heldout' and greedy=True")
  if isinstance(held["size"], int) and held["size"] > config.task.heldout_size:
    errors.append(f"eval.sets.heldout.size={held['size']} exceeds task.heldout_size="
                  f"{config.task.heldout_size}, the held-out split")
  return errors


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
