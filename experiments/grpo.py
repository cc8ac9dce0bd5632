"""GRPO: group-normalised advantages, PPO clip, no critic (the embedded default).

Shao et al. 2024, "DeepSeekMath", arXiv:2402.03300, Sec. 4.1. The base config already
is GRPO on the "rare scratchpad" arithmetic task; this file only names the run.

    rljax train --config experiments/grpo.py                  # the embedded default
    rljax train --config experiments/grpo.py:all_scratchpad   # the earlier default task

`all_scratchpad` is the earlier default: every demonstration worked, 2-4 terms, one
update per rollout. Its SFT start is already strong (75-97 % greedy), so RL has little
to add there and no clipping or length trick has anything to act on.
"""

from rljax.train.config import base_config

STEPS = ("rare_scratchpad", "all_scratchpad")


def get_config(arg=None):
  step = arg or STEPS[0]
  if step not in STEPS:
    raise ValueError(f"unknown grpo variant {step!r}; valid: {list(STEPS)}")
  c = base_config()
  c.run.dir = "runs/grpo" if step == STEPS[0] else f"runs/grpo_{step}"
  if step == "all_scratchpad":
    c.task.difficulty_max, c.task.scratchpad_fraction = 3, 1.0
    c.sft.steps, c.sft.worked_steps, c.sft.max_len = 800, 0, 0
    c.sampling.prompts_per_iteration, c.sampling.n, c.sampling.max_new_tokens = 32, 4, 48
    c.algo.epochs, c.algo.minibatches = 1, 1
    c.optim.actor_lr = 3e-5
  return c
