"""RL versus SFT with the same budget ("SFT memorises, RL generalises").

Chu et al. 2025, "SFT Memorizes, RL Generalizes", arXiv:2501.17161. From the same warm
start, each step gets RL's budget of 60 iterations x 8 updates (and, for the sampling
arm, its 16 x 8 samples per iteration):

- `rl`: the embedded GRPO default.
- `continued_sft`: no policy gradient (algo.pg_coef = 0); every update is an NLL step on 32
  fresh demonstrations of the same mixture the warm start saw (algo.ptx_coef = 1).
- `rejection_sft`: no policy gradient; each iteration samples 8 completions for 16 prompts,
  keeps each prompt's best if it is correct and takes 8 NLL steps on the kept ones
  (STaR / RAFT-style self-training, Llama 2's rejection-sampling fine-tuning).

Every step is also scored on an out-of-distribution split, 6-term chains (the task trains
2-5 terms), with a budget that fits their worked solutions.

    rljax ablate experiments/rl_vs_sft.py --seeds 0-5
"""

from rljax.train.config import base_config

ABLATION_STEPS = ("rl", "continued_sft", "rejection_sft")
# the out-of-distribution split is scored too (`heldout_ood_*` in each run's result.json)
MECHANISMS = {"continued_sft": "train/response_length_mean",
              "rejection_sft": "train/response_length_mean"}


def get_config(arg=None):
  step = arg or ABLATION_STEPS[0]
  if step not in ABLATION_STEPS:
    raise ValueError(f"unknown rl_vs_sft step {step!r}; valid: {list(ABLATION_STEPS)}")
  c = base_config()
  c.run.dir = f"runs/rl_vs_sft_{step}"
  c.task.ood_difficulty = 5
  if step == "continued_sft":
    c.algo.pg_coef, c.algo.ptx_coef = 0.0, 1.0
  elif step == "rejection_sft":
    c.algo.pg_coef = 0.0
    c.algo.rsft_every, c.algo.rsft_prompts = 1, 16      # algo.rsft_k stays 8
    c.algo.rsft_steps, c.algo.rsft_lr, c.algo.rsft_min_score = 8, 1e-4, 1.0
  return c
