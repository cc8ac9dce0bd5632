"""Your own task and reward functions without touching rljax (`examples/reverse_task.py`).

`task.name = "python"` with `task.python = "file.py:factory"` (or "module:factory")
makes the factory's object the task: its prompts, its `score` and its demonstrations
serve SFT, RL and evaluation. `task.reward_fns` adds reward functions
`fn(prompt, completion, answer)`; with `reward_fns_mode = "add"` they join the task's own
score, weighted by `task.reward_weights`. `:gdpo` normalises each reward separately
(algo.reward_aggregation = "normalize_then_sum").

    rljax train --config experiments/user_task.py
    rljax train --config experiments/user_task.py:gdpo
"""

from rljax.train.config import base_config

STEPS = ("sum", "gdpo")


def get_config(arg=None):
  step = arg or STEPS[0]
  if step not in STEPS:
    raise ValueError(f"unknown user_task variant {step!r}; valid: {list(STEPS)}")
  c = base_config()
  c.run.dir = f"runs/user_task_{step}"
  c.task.name, c.task.python = "python", "examples/reverse_task.py:make_task"
  c.task.reward_fns, c.task.reward_weights = ["examples/reverse_task.py:brevity"], [0.2]
  c.task.reward_fns_mode = "add"
  c.sft.steps, c.sft.worked_steps, c.sft.max_len = 300, 0, 0
  c.sampling.max_new_tokens = 12
  c.run.iterations = 30
  if step == "gdpo":
    c.algo.reward_aggregation = "normalize_then_sum"
  return c
