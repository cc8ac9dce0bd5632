"""Qwen2.5-7B, GRPO on MATH with 4,096-token responses, for a v5e-64 slice (64 chips).

A run users would launch on a pod. Plan it from any host first (no weights, no TPU):

    pip install -e ".[tpu]"
    rljax plan --config experiments/qwen25_7b_grpo_v5e.py --topology v5e-64

then train from a local checkpoint on the slice (one process per host):

    rljax train --config experiments/qwen25_7b_grpo_v5e.py:/data/Qwen2.5-7B

Without an argument the policy is the `qwen2.5-7b` shape preset (`model.hf_config`: the
published config.json, random weights), which is all `rljax plan` reads.

The settings follow the GRPO recipes users run at this scale (DeepSeekMath's GRPO,
Shao et al. 2024, arXiv:2402.03300, Sec. 4.1; verl's Qwen2.5-7B GRPO example): 128 prompts
x 8 samples per iteration, 4 updates of 256 sequences, no KL term, learning rate 1e-6,
bf16 compute over fp32 master weights, every decoder block rematerialised. On v5e (16 GB
per chip) the parameters must stay sharded while sampling, hence the static sampler: the
continuous sampler holds a whole copy of the parameters on every chip. `rljax plan` on
v5e-64 (fsdp 64, splash attention): every program fits, the largest is the prefill at
12.9 GB per chip (docs/scale.md).
"""

from rljax.train.config import base_config
from rljax.train.recipes import math_boxed_task, published_model


def get_config(arg=None):
  c = base_config()
  c.run.dir = "runs/qwen25_7b_grpo_v5e"
  c.run.iterations, c.run.save_every, c.run.eval_every = 200, 20, 20
  published_model(c, arg, "qwen2.5-7b")
  math_boxed_task(c)
  c.sampling.prompts_per_iteration, c.sampling.n = 128, 8
  c.sampling.max_new_tokens = 4096
  c.sampling.continuous = False
  c.sampling.eval_n = 4
  c.algo.epochs, c.algo.minibatches, c.algo.microbatches = 1, 4, 4
  c.algo.kl_coef, c.algo.kl_placement = 0.0, "none"
  c.optim.actor_lr, c.optim.weight_decay, c.optim.warmup_steps = 1e-6, 0.01, 10
  c.parallel.data, c.parallel.fsdp, c.parallel.tensor = 1, -1, 1
  return c
