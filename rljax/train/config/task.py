"""The `task` group (prompts, data sources, rewards) and the `sampling` group (rollouts and
evaluation sampling), one frozen dataclass each with its own checks."""

from __future__ import annotations

import dataclasses
import re

from rljax.data.records_task import ANSWER_EXTRACTORS
from rljax.data.samplers import SAMPLERS
from rljax.data.tasks import TASKS
from rljax.train.config.fields import Group, field
from rljax.train.config.groups import SAMPLER_DTYPES

TASK_NAMES = (*TASKS, "jsonl", "hf_dataset", "tfds", "python")


@dataclasses.dataclass(frozen=True)
class Task(Group):
  """The task, its data source, prompts and rewards."""

  SECTION = "task"
  name: str = field("arithmetic", "a task of rljax.data.tasks.TASKS or a source", TASK_NAMES)
  difficulty: int = field(1, "lowest difficulty level")
  difficulty_max: int = field(4, "highest level (mixed uniformly); 0: same as difficulty")
  seed: int = field(1234, "seed of the task's prompts")
  heldout_size: int = field(128, "held-out prompts")
  ood_difficulty: int = field(0, "synthetic tasks: also evaluate this level", ">= 0 (0: off)")
  digits: int = field(1, "arithmetic: digits per operand")
  # 0.15: greedy answers tersely and fails, sampling finds the scratchpad ~13 % of the time
  scratchpad_fraction: float = field(0.15, "arithmetic: share of demos with worked steps",
                                     "[0, 1]")
  jsonl_path: str = field("", "name == 'jsonl': rows {prompt, answer[, solution]}")
  hf_path: str = field("", "name == 'hf_dataset': hub name, data file or save_to_disk dir")
  hf_config: str = field("", "hf_dataset: configuration name (GSM8K: 'main')")
  hf_split: str = field("train", "hf_dataset: split, slicing allowed ('train[:1000]')")
  tfds_name: str = field("", "name == 'tfds': 'name[/config][:version]' (array_record)")
  tfds_split: str = field("train", "tfds: split, slicing allowed")
  tfds_data_dir: str = field("", "tfds: directory of prepared datasets ('': TFDS's default)")
  prompt_field: str = field("prompt", "jsonl/hf_dataset/tfds: field of the prompt text")
  answer_field: str = field("answer", "... field of the ground-truth answer")
  solution_field: str = field("solution", "... field of a worked solution (optional)")
  answer_extractor: str = field("none", "none | gsm8k (after '####') | boxed | regex",
                                ANSWER_EXTRACTORS)
  answer_regex: str = field("", "answer_extractor == 'regex': group 1 of the last match")
  prompt_template: str = field("", "'' or text with '{prompt}'")
  chat_template: bool = field(False, "wrap prompts in the HF tokenizer's chat template")
  long_prompts: str = field("reject", "prompts that do not fit", ("reject", "truncate"))
  prompt_sampler: str = field("uniform", "uniform | curriculum | prioritized", SAMPLERS)
  curriculum_steps: int = field(40, "curriculum: iterations from easiest to hardest")
  format_weight: float = field(0.1, "weight of the format reward in the total score")
  reward_on_failure: str = field("score_failure", "a reward fn failed: score_failure | raise",
                                 ("score_failure", "raise"))
  reward_timeout: float = field(10.0, "seconds per reward call (0: no deadline)")
  reward_model_path: str = field("", "a saved reward model (rljax.rewards) ...")
  reward_model_weight: float = field(0.0, "... added to the verifier's score with this weight")
  # fn(prompt, completion, answer) -> float | {"score": ...}; rljax.rewards.user
  reward_fns: tuple[str, ...] = field([], "your rewards: 'module:fn' | 'path/file.py:fn'")
  reward_weights: tuple = field([], "one weight per reward_fns entry ([]: 1.0 each)")
  reward_fns_mode: str = field("replace", "replace the task's verifier in the score | add",
                               ("replace", "add"))
  python: str = field("", "name == 'python': 'module:factory' of your task object")
  # factory(prompt) -> Env; each row keeps its KV cache across turns (rljax.sampling.multiturn)
  env: str = field("", "multi-turn episodes: 'module:factory' | 'file.py:factory'")
  env_timeout: float = field(10.0, "seconds per environment call (0: no deadline)")
  env_reward_only: bool = field(False, "score = the environment's step rewards only")

  def check(self, c):
    c.need(not self.ood_difficulty or self.name in TASKS, "ood_difficulty",
           f"needs a synthetic task ({sorted(TASKS)}), not task.name={self.name!r}")
    for name, source in (("jsonl_path", "jsonl"), ("hf_path", "hf_dataset"),
                         ("tfds_name", "tfds")):
      if self.name == source and not getattr(self, name):
        c.problems.append(f"task.{name} is empty but task.name={source!r}")
    c.need(not self.prompt_template or "{prompt}" in self.prompt_template, "prompt_template",
           "must contain '{prompt}'")
    c.need((self.name == "python") == bool(self.python), "python",
           f"is the task factory of task.name='python' (got task.name={self.name!r}): set both "
           "or neither")
    c.need(not self.env or ":" in self.env, "env",
           ": expected 'module.path:factory' or 'file.py:factory'")
    self._check_rewards(c)

  def _check_rewards(self, c):
    if self.answer_extractor == "regex":
      try:
        groups = re.compile(self.answer_regex).groups if self.answer_regex else 0
        c.need(groups >= 1, "answer_regex", "needs a capture group (answer_extractor='regex')")
      except re.error as e:
        c.need(False, "answer_regex", f"does not compile: {e}")
    fns, weights = self.reward_fns, self.reward_weights
    c.need(all(isinstance(f, str) and ":" in f for f in fns), "reward_fns",
           ": each entry is 'module.path:fn' or 'file.py:fn'")
    if weights and len(weights) != len(fns):
      c.problems.append(f"task.reward_weights has {len(weights)} entries for {len(fns)} "
                        "task.reward_fns (or leave it empty for 1.0 each)")
    c.need(all(isinstance(w, int | float) for w in weights), "reward_weights", "must be numbers")


@dataclasses.dataclass(frozen=True)
class Sampling(Group):
  """Rollout and evaluation sampling."""

  SECTION = "sampling"
  prompts_per_iteration: int = field(16, "prompts per RL iteration", ">= 1")
  n: int = field(8, "G: completions per prompt", ">= 1")
  # 36 binds: 5-term scratchpads reach it, so truncation and the soft overlong buffer act
  max_new_tokens: int = field(36, "T: completion tokens (multi-turn: the episode's budget)",
                              ">= 1")
  temperature: float = field(1.0, "sampling temperature", "> 0")
  top_k: int = field(0, "top-k sampling", ">= 0 (0: off)")
  top_p: float = field(1.0, "nucleus sampling (1: off)", "(0, 1]")
  min_p: float = field(0.0, "min-p sampling (0: off)", "[0, 1)")
  sampler_dtype: str = field("", "the sampler's copy ('': same as training)", SAMPLER_DTYPES)
  # same tokens as the static sampler; slots=0: every row resident, compacted as rows
  # finish; slots < rows: a queue refilling slots (static sampler: waves of `slots` rows)
  continuous: bool = field(True, "continuous batching (rljax.sampling.continuous)")
  slots: int = field(0, "decode slots", "int >= 0 (0: all rows)")
  share_prefill: bool = field(True, "prefill each prompt once for its n samples")
  max_turns: int = field(1, "task.env: turns per episode", "int >= 1")
  max_total_tokens: int = field(0, "task.env: the episode budget",
                                "int >= 0 (0: sampling.max_new_tokens)")
  turn_stop: tuple[str, ...] = field([], "task.env: the strings that end a turn")
  max_observation_tokens: int = field(64, "an observation is cut to this many tokens",
                                      "int >= 0")
  # batch t is sampled by policy version max(0, t - k) (rljax.train.rollout.async_rollouts)
  max_staleness: int = field(0, "asynchronous rollouts k", "int >= 0 (0: synchronous)")
  # a request in flight at a weight handoff continues with the new weights (k + 1 segments)
  partial_rollouts: bool = field(False, "max_staleness > 0: requests span weight versions")
  eval_n: int = field(4, "samples per held-out prompt for pass@k / avg@k", ">= 0")
  eval_temperature: float = field(1.0, "temperature of the held-out samples")
  eval_passk_n: int = field(0, "pass@k up to this k (powers of two), before/after RL (0: off)")
  eval_passk_prompts: int = field(128, "... on this many held-out prompts", ">= 0 (0: all)")

  def check(self, c):
    c.need(self.eval_passk_n == 0 or self.eval_passk_n > self.eval_n, "eval_passk_n",
           f"must be 0 (off) or > sampling.eval_n={self.eval_n}")
    c.need(all(isinstance(x, str) and x for x in self.turn_stop), "turn_stop",
           "must be non-empty strings")
