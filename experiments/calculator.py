"""Multi-turn tool use: a calculator the model learns to call (issue 16's embedded task).

`C:347+589` needs a 3-digit sum the 0.6M-parameter model cannot do in its head. It may
write `<call>347+589</call>`; the turn ends there (`sampling.turn_stop`), the environment
(`rljax.envs.calculator:calculator_env`) answers `<result>936</result>`, the row's KV cache
is extended with those ids, and the model continues, e.g. `<answer>936</answer>`. The SFT
warm start shows the tool in 20 % of its demonstrations (the `<result>` span carries no
loss: it is the environment's); the rest answer directly. Greedy decoding after SFT
guesses; sampling sometimes calls the tool and is then right: GRPO promotes the call.

    rljax train --config experiments/calculator.py
    rljax train --config experiments/calculator.py:retry   # "wrong, try again" episodes
"""

from rljax.train.config import base_config

STEPS = ("tool", "retry")


def get_config(arg=None):
  step = arg or STEPS[0]
  if step not in STEPS:
    raise ValueError(f"unknown calculator variant {step!r}; valid: {list(STEPS)}")
  c = base_config()
  c.run.dir = f"runs/calculator_{step}"
  c.run.iterations = 40
  c.task.name = "calculator"
  c.task.digits, c.task.difficulty, c.task.difficulty_max = 3, 1, 1
  c.task.scratchpad_fraction = 0.2          # share of SFT demonstrations that call the tool
  c.sft.steps, c.sft.worked_steps, c.sft.max_len = 600, 0, 0
  c.sampling.max_new_tokens = 40             # the whole episode: sampled + observation tokens
  c.sampling.max_turns = 2
  c.sampling.turn_stop = ["</call>"]
  c.task.env = "rljax.envs.calculator:calculator_env"
  if step == "retry":
    c.task.env = "rljax.envs.calculator:retry_env"
    c.task.scratchpad_fraction = 0.0        # answer-only demonstrations
    c.sampling.turn_stop = ["</answer>"]
    c.sampling.max_turns = 3
    c.task.env_reward_only = True           # the score is the environment's (1 if solved)
  return c
