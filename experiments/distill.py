"""On-policy distillation of the main job's RL-trained model into a smaller student.

Agarwal et al. 2024, "On-Policy Distillation of Language Models: Learning from
Self-Generated Mistakes" (GKD), arXiv:2306.13649; Thinking Machines, "On-Policy
Distillation" (2025): the student samples, the frozen teacher scores every sampled token,
and the per-token advantage is −(log π_student − log π_teacher) (`rljax.ops.distill`).

The teacher is `experiments/grpo.py`'s model (3 layers, width 128: the SFT start plus 60
GRPO iterations), trained once per seed into `runs/distill_teacher/seed<S>` the first time
a step needs it (`algo.distill_teacher_recipe`) and reused after. The student is a smaller
decoder (2 layers, width 64) from its own SFT start (the warm start's cache key includes
the model). Every step has the same budget: 60 iterations, 16 prompts x 8 generated
samples and 8 updates each.

- `grpo`: the student trained by GRPO alone on the task's reward.
- `distill`: on-policy distillation alone: the teacher's per-token signal is the only
  advantage (no task reward).
- `sft_on_teacher`: SFT on the teacher's samples with the same budget of generated samples:
  each iteration the teacher samples one completion for each of 128 prompts (16 x 8), all
  kept, and the student takes 8 NLL steps on them (sequence-level knowledge distillation,
  Kim & Rush 2016, arXiv:1606.07947; `algo.rsft_from_teacher`), no policy gradient.

Every step logs the student's reverse KL to the teacher on its own samples
(`distill/reverse_kl`; the teacher only scores in `grpo` and `sft_on_teacher`), and is
evaluated on 6-term chains (the task trains 2-5 terms) as the named set `six_terms`.

    rljax ablate experiments/distill.py --seeds 0,1,2
"""

from rljax.train.config import base_config, eval_set

ABLATION_STEPS = ("grpo", "distill", "sft_on_teacher")
# what the distillation steps act on: the student's reverse KL to the teacher on its own
# samples (lower is better); the six_terms set is scored too (`heldout_six_terms/*`)
MECHANISMS = {"distill": "distill/reverse_kl", "sft_on_teacher": "distill/reverse_kl"}


def get_config(arg=None):
  step = arg or ABLATION_STEPS[0]
  if step not in ABLATION_STEPS:
    raise ValueError(f"unknown distill step {step!r}; valid: {list(ABLATION_STEPS)}")
  c = base_config()
  c.run.dir = f"runs/distill_{step}"
  c.model.hidden_size, c.model.intermediate_size, c.model.num_layers = 64, 192, 2
  c.model.num_heads, c.model.num_kv_heads, c.model.head_dim = 2, 1, 32
  c.algo.distill_teacher = "runs/distill_teacher/seed{seed}"
  c.algo.distill_teacher_recipe = "experiments/grpo.py"
  c.algo.distill_coef = 0.0   # the teacher only scores (distill/reverse_kl)
  c.eval.sets.six_terms = eval_set("arithmetic:5", size=128, k=4)
  if step == "distill":
    c.algo.distill_coef, c.algo.distill_mode, c.algo.distill_only = 1.0, "advantage", True
  elif step == "sft_on_teacher":
    c.algo.pg_coef = 0.0
    c.algo.rsft_every, c.algo.rsft_from_teacher = 1, True
    c.algo.rsft_k, c.algo.rsft_prompts, c.algo.rsft_min_score = 1, 128, None
    c.algo.rsft_steps, c.algo.rsft_lr = 8, 1e-4
  return c
