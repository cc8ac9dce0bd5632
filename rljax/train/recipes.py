"""Pieces the pod recipes (experiments/qwen*_v5*.py) share: a published model and the
R1-Zero MATH task, so each recipe file says only what is its own."""

from __future__ import annotations


def published_model(c, checkpoint: str | None, preset: str) -> None:
  """A local Hugging Face checkpoint when given, else the preset's shapes with random weights
  (`rljax plan` reads only shapes); bf16 compute over fp32 parameters, blocks rematerialised."""
  if checkpoint:
    c.model.hf_path = checkpoint
  else:
    c.model.hf_config = preset
  c.model.dtype, c.model.param_dtype, c.model.remat = "bfloat16", "float32", True


def math_boxed_task(c, *, prompt_len: int = 512) -> None:
  """MATH (DigitalLearningGmbH/MATH-lighteval) with the answer in the solution's last
  \\boxed{}, RL from the base model (R1-Zero style, no SFT warm start)."""
  c.task.name, c.task.hf_path, c.task.hf_split = (
      "hf_dataset", "DigitalLearningGmbH/MATH-lighteval", "train")
  c.task.prompt_field, c.task.answer_field, c.task.answer_extractor = (
      "problem", "solution", "boxed")
  c.task.prompt_template = ("{prompt}\nPlease reason step by step, and put your final answer "
                            "within \\boxed{}.")
  c.task.long_prompts = "truncate"
  c.sft.steps = 0
  c.plan.prompt_len = prompt_len           # MATH problems fit 512 tokens
