"""On-policy distillation: a frozen teacher scores every token the student sampled.

The student π_s samples y ~ π_s(·|x); the teacher π_t returns log π_t(y_t | x, y_<t) for
each sampled token. The per-token reverse KL

    KL(π_s ‖ π_t)(x, y_<t) = E_{y_t ~ π_s}[log π_s(y_t | ·) − log π_t(y_t | ·)]

is estimated by its single-sample (k1) value d_t = log π_s(y_t) − log π_t(y_t), a dense
signal on every token (Agarwal et al. 2024, "On-Policy Distillation of Language Models:
Learning from Self-Generated Mistakes" (GKD), arXiv:2306.13649: on-policy KD on
student-generated sequences with the reverse KL as the divergence; Thinking Machines,
"On-Policy Distillation", 2025: the per-token advantage −(log π_s − log π_t), discount 0).

Two ways in, by `algo.distill_mode`:

- "advantage": A_t = −c·d_t is each token's advantage (plus the task's advantage when the
  task reward is on). With a policy-gradient loss, E_{y_t~π_s}[∇log π_s(y_t)·(−A_t)] =
  c·∇_θ KL(π_s‖π_t)(x, y_<t): the gradient of the token-level reverse KL at the prefixes the
  student visited, not differentiated through the prefix distribution (GKD's on-policy KD).
- "reward": c·d_t is a per-token penalty in the reward, as KL-in-reward with the teacher in
  place of the reference (`rljax.ops.kl.kl_penalized_rewards`): token-level estimators see
  r_t = 1[t = last]·R − c·d_t and credit it to every earlier token through the return
  (the sequence-level reverse KL of MiniLLM, Gu et al. 2024, arXiv:2306.08543);
  sequence-level estimators (GRPO) subtract c·Σ_t d_t = c·log π_s(y|x)/π_t(y|x) from the
  score before the group baseline.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp


def distill_reverse_kl(logp, teacher_logp, mask):
  """Per-token reverse-KL estimate d_t = log π_s(y_t) − log π_t(y_t) of sampled tokens (k1).

  E_{y_t~π_s}[d_t] = KL(π_s(·|x, y_<t) ‖ π_t(·|x, y_<t)) (GKD, arXiv:2306.13649, on-policy
  KD with the reverse KL; the k1 estimator of Schulman 2020, "Approximating KL Divergence").

  Note: k1 is unbiased but a single sample can be negative; the batch mean is what
  estimates the KL (`distill/reverse_kl`). It is the unclamped log-ratio: the teacher's
  log-probs of tokens it finds implausible are very negative, and that is the signal.

  Args:
    logp: log π_s of the sampled tokens under the student (sampling) policy, [B, T].
    teacher_logp: log π_t of the same tokens under the teacher, [B, T].
    mask: completion mask, [B, T] (required: padding carries no KL).
  Returns:
    d, float32 [B, T]; 0 at masked positions.
  """
  chex.assert_rank(logp, 2)
  chex.assert_equal_shape((logp, teacher_logp, mask))
  keep = mask > 0
  logp = jnp.where(keep, logp.astype(jnp.float32), 0.0)
  teacher_logp = jnp.where(keep, teacher_logp.astype(jnp.float32), 0.0)
  return jnp.where(keep, logp - teacher_logp, 0.0)


def distill_advantages(logp, teacher_logp, mask, *, coef):
  """Per-token distillation advantage A_t = −c·(log π_s(y_t) − log π_t(y_t)), no gradient.

  The advantage of on-policy distillation (Thinking Machines, "On-Policy Distillation",
  2025: the negative reverse KL per token, discount factor 0; GKD, arXiv:2306.13649,
  on-policy KD with the reverse KL): tokens the teacher finds more likely than the student
  does are pushed up, the others down. In a policy-gradient loss −A_t·log π_θ(y_t), its
  expected gradient is c·∇_θ KL(π_θ(·|x, y_<t) ‖ π_t(·|x, y_<t)) per visited prefix.

  Note: discount 0 (each token credits only its own log-ratio), as the Thinking Machines
  recipe; the reward-to-go of the penalty (the sequence-level reverse KL of MiniLLM,
  arXiv:2306.08543) is `algo.distill_mode="reward"` with a token-level estimator. The
  advantage is under stop-gradient: the student's log-prob enters the loss only through
  the policy-gradient term, never through A_t.

  Args:
    logp: log π_s of the sampled tokens (the behaviour policy the loss's ratio is
      taken against), [B, T].
    teacher_logp: log π_t of the same tokens, [B, T].
    mask: completion mask, [B, T].
    coef: c >= 0, the distillation coefficient.
  Returns:
    advantages, float32 [B, T]; 0 at masked positions.
  """
  d = distill_reverse_kl(logp, teacher_logp, mask)
  return jax.lax.stop_gradient(-coef * d)
