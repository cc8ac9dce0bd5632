"""Environments for the calculator task (`rljax.data.calculator`): a tool, and a retry loop.

`calculator_env`: the model's turn ends with `</call>` (`sampling.turn_stop`); the
environment evaluates the expression between `<call>` and `</call>` and answers
`<result>value</result>` (a malformed call: `<result>error</result>`, counted as a failed
tool call). A turn that ends otherwise (the model's final answer) ends the episode.

`retry_env`: the model answers in `<answer>...</answer>` (the turn stop is `</answer>`); a
correct answer ends the episode with step reward 1, a wrong one gets the observation
`wrong, try again` and another turn (up to `sampling.max_turns`): multi-turn credit.
"""

from __future__ import annotations

import re

from rljax.data.calculator import evaluate, value_text
from rljax.envs import Step

_CALL = re.compile(r"<call>(.*?)</call>\s*$", re.DOTALL)
_ANSWER = re.compile(r"<answer>(.*?)</answer>\s*$", re.DOTALL)


class _PromptEnv:
  """Keeps the episode's prompt (its answer fixes the width or checks the attempt); no
  first observation."""

  def __init__(self, prompt):
    self.prompt = prompt

  def reset(self, prompt) -> str:
    del prompt
    return ""


class CalculatorEnv(_PromptEnv):
  """Evaluates `<call>a+b-c</call>`; the task's verifier scores the final answer."""

  def step(self, action: str) -> Step:
    call = _CALL.search(action)
    if call is None:   # no tool call: the model's final turn
      return Step(done=True, info={"tool_call": False})
    try:
      value = evaluate(call.group(1))
    except ValueError:
      return Step(observation="<result>error</result>", info={"tool_call": True, "error": True})
    width = len(self.prompt.answer)   # the task's fixed answer width
    return Step(observation=f"<result>{value_text(value, width)}</result>",
                info={"tool_call": True})


class RetryEnv(_PromptEnv):
  """Step reward 1 for a correct answer (episode done), else `wrong, try again`."""

  def step(self, action: str) -> Step:
    answer = _ANSWER.search(action)
    content = answer.group(1).strip() if answer else ""
    correct = bool(re.fullmatch(r"-?\d+", content)) and int(content) == int(self.prompt.answer)
    if correct:
      return Step(reward=1.0, done=True, info={"tool_call": False})
    return Step(observation="\nwrong, try again\n", info={"tool_call": False})


def calculator_env(prompt) -> CalculatorEnv:
  return CalculatorEnv(prompt)


def retry_env(prompt) -> RetryEnv:
  return RetryEnv(prompt)
