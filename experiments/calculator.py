"""Multi-turn tool use: a calculator the model learns to call (the embedded multi-turn task).

`C:347+589` needs a 3-digit sum the 0.6M-parameter model cannot do in its head. It may
write `<call>347+589</call>`; the turn ends there (`sampling.turn_stop`), the environment
(`rljax.envs.calculator:calculator_env`) answers `<result>0936</result>`, the row's KV
cache is extended with those ids, and the model continues, e.g. `<answer>0936</answer>`
(sums are zero-padded to 4 digits: copying the result is then a fixed-distance copy,
which the tiny model learns; with variable widths it did not, `docs/testbed.md`). The SFT
warm start first shows the tool in every demonstration (800 steps), then in 15 % of them
(200 steps; the `<result>` span carries no loss: it is the environment's). Greedy
decoding after SFT answers directly and is wrong; sampling calls the tool ~12 % of the
time and is then right ~95 % of the time: GRPO promotes the call.

`:retry` answers 2-digit sums without a tool; a wrong `<answer>` gets `wrong, try again`
and another turn (3 in all), and each attempt's reward sits on its own turn
(`algo.turn_rewards`).

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
  c.task.digits, c.task.difficulty_max = 3, 1
  # task.scratchpad_fraction (0.15) is here the share of SFT demonstrations that call the
  # tool. As for the arithmetic default, sft.worked_steps (800 of 1000) is a skill phase
  # where every demonstration calls it, then the mixture that makes greedy answer directly.
  c.sft.max_len = 0
  c.sampling.max_new_tokens = 40             # the whole episode: sampled + observation tokens
  c.sampling.max_turns = 2
  c.sampling.turn_stop = ["</call>"]
  c.task.env = "rljax.envs.calculator:calculator_env"
  if step == "retry":
    c.task.env = "rljax.envs.calculator:retry_env"
    c.task.digits = 2
    c.task.scratchpad_fraction = 0.0        # answer-only demonstrations
    c.sft.worked_steps = 0
    c.sampling.turn_stop = ["</answer>"]
    c.sampling.max_turns = 3
    c.sampling.max_new_tokens = 64
    c.task.env_reward_only = True           # the score is the environment's (1 if solved)
    c.algo.turn_rewards = True              # each attempt's reward on its own turn
  return c
