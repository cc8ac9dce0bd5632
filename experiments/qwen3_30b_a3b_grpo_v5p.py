"""Qwen3-30B-A3B (a mixture of experts: 128 experts, 8 per token), GRPO with routing replay
on MATH with 4,096-token responses, for a v5p-64 slice (32 chips, fsdp 8 x expert 4).

Plan it from any host first (no weights, no TPU):

    pip install -e ".[tpu]"
    rljax plan --config experiments/qwen3_30b_a3b_grpo_v5p.py --topology v5p-64

and train from a local checkpoint on the slice (one process per host):

    rljax train --config experiments/qwen3_30b_a3b_grpo_v5p.py:/data/Qwen3-30B-A3B

Without an argument the policy is the `qwen3-30b-a3b` shape preset (`model.hf_config`: the
published config.json, random weights), which is all `rljax plan` reads.

The settings are the 7B recipe's (`experiments/qwen25_7b_grpo_v5e.py`: 128 prompts x 8
samples, 4 updates of 256 sequences, no KL term, bf16 compute over fp32 master weights,
every block rematerialised, the static sampler), plus what a MoE policy needs:

- `parallel.expert = 4`: each MoE layer's 128 experts are split 32 per expert group over
  an `expert` mesh axis (docs/moe.md, "Expert parallelism"); `parallel.fsdp = 8` splits
  the rest and every expert's weights further. 30.5 B fp32 parameters and their Adam
  moments are 366 GB, 11.4 GB per chip. The expert axis does not split the batch (the
  batch axes are data and fsdp), so each chip holds 1/8 of the rows: with fsdp 4 x expert 8
  and all 1,024 rows decoded at once, the KV cache alone was 116 GB per chip (decode 133 GB,
  the routing forward 96 GB: docs/scale.md). Hence the static sampler's waves of 256 rows
  and 8 micro-batches.
- `algo.routing_replay = "sampler"` (R3, arXiv:2510.11370): the old-log-prob and update
  forwards use the experts the sampler chose; the sampler records them, one uint8 id per
  token, MoE layer and routed expert (48 x 8 = 384 bytes a token).
- The static sampler: the continuous sampler's slot loops hold the parameters whole on
  every chip (122 GB in fp32, more than a v5p chip's 95 GB; docs/scale.md).
"""

from rljax.train.config import base_config
from rljax.train.recipes import math_boxed_task, published_model


def get_config(arg=None):
  c = base_config()
  c.run.dir = "runs/qwen3_30b_a3b_grpo_v5p"
  c.run.iterations, c.run.save_every, c.run.eval_every = 200, 20, 20
  published_model(c, arg, "qwen3-30b-a3b")
  math_boxed_task(c)
  c.sampling.prompts_per_iteration, c.sampling.n = 128, 8
  c.sampling.max_new_tokens = 4096
  c.sampling.continuous, c.sampling.slots = False, 256   # static sampler, waves of 256 rows
  c.sampling.eval_n = 4
  c.algo.epochs, c.algo.minibatches, c.algo.microbatches = 1, 4, 8
  c.algo.kl_coef, c.algo.kl_placement = 0.0, "none"
  c.algo.routing_replay = "sampler"
  c.optim.actor_lr, c.optim.weight_decay, c.optim.warmup_steps = 1e-6, 0.01, 10
  c.parallel.data, c.parallel.fsdp, c.parallel.tensor, c.parallel.expert = 1, -1, 1, 4
  return c
