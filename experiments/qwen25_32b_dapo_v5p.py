"""DAPO on Qwen2.5-32B with 20,480-token responses, for a v5p-128 slice (64 chips).

Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale",
arXiv:2503.14476: the paper's run, with the settings of its public recipe (verl's
`recipe/dapo/run_dapo_qwen2.5_32b.sh`): 512 prompts x 16 samples per iteration, updates
of 32 prompts (16 per iteration), clip-higher (0.2 / 0.28), token-level loss, no KL,
20,480 response tokens with a 4,096-token soft overlong buffer, dynamic sampling (at most
10 generation rounds), learning rate 1e-6 with 10 warm-up steps, weight decay 0.1,
gradient clipping 1.0. Plan it from any host first (no weights, no TPU):

    pip install -e ".[tpu]"
    rljax plan --config experiments/qwen25_32b_dapo_v5p.py --topology v5p-128

and train from a local checkpoint on the slice:

    rljax train --config experiments/qwen25_32b_dapo_v5p.py:/data/Qwen2.5-32B

Decoding 8,192 sequences of 20k tokens at once needs a KV cache of about 48 TB (5.9 GB a
row at 22,528 positions). The recipe uses the static sampler in waves of `sampling.slots`
= 256 rows (4 per chip; 23.6 GB of KV cache per chip): the continuous sampler's slot loops
hold the parameters whole on every chip (131 GB in fp32 for 32.8 B parameters, more than a
v5p chip's 95 GB; `rljax plan` measured its decode at 266 GB per chip), while the static
sampler keeps them fsdp-sharded. A wave holds 4 of a prompt's 16 samples per chip, so
each row is prefilled on its own (no shared prefill). The prompts are DAPO's
math set (BytedTsinghua-SIA/DAPO-Math-17k, as open-r1/DAPO-Math-17k-Processed gives it with
flat fields), whose answers are integers.
"""

from rljax.train.config import base_config
from rljax.train.recipes import published_model


def get_config(arg=None):
  c = base_config()
  c.run.dir = "runs/qwen25_32b_dapo_v5p"
  c.run.iterations, c.run.save_every, c.run.eval_every = 300, 10, 10
  published_model(c, arg, "qwen2.5-32b")
  # DAPO-Math-17k with flat fields: prompt (the user turn), solution (the integer answer)
  c.task.name, c.task.hf_path, c.task.hf_config = ("hf_dataset", "open-r1/DAPO-Math-17k-Processed",
                                                   "en")
  c.task.prompt_field, c.task.answer_field, c.task.hf_split = "prompt", "solution", "train"
  c.task.long_prompts = "truncate"
  c.sft.steps = 0
  c.plan.prompt_len = 2048                 # the recipe's max_prompt_length
  c.sampling.prompts_per_iteration, c.sampling.n = 512, 16
  c.sampling.max_new_tokens = 20480
  c.sampling.temperature, c.sampling.top_p = 1.0, 1.0
  c.sampling.continuous, c.sampling.slots = False, 256   # static sampler, waves of 256 rows
  c.sampling.eval_n = 4
  c.algo.epochs, c.algo.minibatches, c.algo.microbatches = 1, 16, 8
  c.algo.eps_low, c.algo.eps_high = 0.2, 0.28
  c.algo.loss_agg = "token_mean"
  c.algo.kl_coef, c.algo.kl_placement = 0.0, "none"
  c.algo.soft_overlong, c.algo.overlong_cache_len = True, 4096
  c.algo.dynamic_sampling, c.algo.dynamic_sampling_max_rounds = True, 10
  c.optim.actor_lr, c.optim.weight_decay, c.optim.warmup_steps, c.optim.grad_clip = (
      1e-6, 0.1, 10, 1.0)
  c.parallel.data, c.parallel.fsdp, c.parallel.tensor = 1, -1, 1
  return c
