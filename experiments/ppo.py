"""PPO with a critic (the InstructGPT-style RLHF recipe).

Ouyang et al. 2022, arXiv:2203.02155; Schulman et al. 2017, arXiv:1707.06347. GAE
advantages from a value model, value clipping, per-token KL in the reward with the
adaptive controller (Ziegler et al. 2019), global advantage whitening, critic warm-up with
the actor frozen, critic lr about 2x the actor's. `arg == "ptx"` mixes the SFT loss on
demonstrations into the RL loss (InstructGPT's PPO-ptx).
"""

from rljax.train.config import base_config


def get_config(arg=None):
  c = base_config()
  c.run.dir = "runs/ppo" + (f"_{arg}" if arg else "")
  c.algo.advantage = "gae"
  c.algo.lam = 0.95
  c.algo.whiten_advantages = True
  c.algo.kl_placement = "reward"
  c.algo.kl_estimator = "k1"
  c.algo.kl_controller = "adaptive"
  c.algo.kl_coef = 0.01
  c.algo.critic_warmup_iterations = 2
  c.algo.minibatches = 2
  c.algo.loss_agg = "token_mean"
  c.optim.critic_lr = 2 * c.optim.actor_lr
  if arg == "ptx":
    c.algo.ptx_coef = 0.1
  return c
