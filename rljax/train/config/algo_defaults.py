"""The `algo` group of the base config: one flat section, built from four groups of fields.

The fields each registered policy loss and advantage estimator owns come from their
registries beside the kernels (`rljax.ops.policy_loss.POLICY_LOSSES`,
`rljax.ops.estimators.ADVANTAGE_ESTIMATORS`), so a new loss brings its fields with it.
"""

from __future__ import annotations

from ml_collections import ConfigDict

from rljax.ops.estimators import estimator_fields
from rljax.ops.policy_loss import policy_loss_fields


def algo_defaults() -> ConfigDict:
  """The RL algorithm: one flat section, built from four groups of fields."""
  return ConfigDict({**_algo_objective(), **_algo_regularisers(), **_algo_data(),
                     **_algo_distill()})


def _algo_objective() -> dict:
  """Advantage estimator and policy loss (advantages, clipping, aggregation, epochs), with
  the fields each registered loss and estimator owns (their docstrings say what they do)."""
  return dict(
      # advantages: a name of rljax.ops.estimators.ADVANTAGE_ESTIMATORS
      advantage="grpo",
      adv_eps=1e-6,
      pass_k=4,                # for advantage == "pass_at_k"
      gamma=1.0,
      lam=1.0,
      whiten_advantages=False,
      # policy loss: a name of rljax.ops.policy_loss.POLICY_LOSSES (ppo, cispo, reinforce,
      # clip_cov, kl_cov, sapo, geo_mean, gpg, dppo_tv, dppo_kl, dro, luspo, vespo, ...)
      policy_loss="ppo",
      ratio_level="token",     # token | sequence (GSPO) | sequence_token (GSPO-token)
      eps_low=0.2,
      eps_high=0.2,
      dual_clip=0.0,           # 0: off; c > 1 bounds the loss of negative advantages
      ratio_cap=0.0,           # 0: off; δ > 1 caps the unclipped branch (TRL `delta`)
      **policy_loss_fields(),  # cispo_*, clip_cov_*, kl_cov_*, sapo_*, dppo_*, dro_*, vespo_*
      **estimator_fields(),    # gpg_f_norm, gpg_alpha, otb_handle_zero_tail
      pf_ppo="none",           # none | pow | max_min | max_random: PF-PPO resampling of the batch
      pf_ppo_power=2.0,        # pf_ppo == "pow": exponent
      loss_agg="seq_mean_token_mean",
      epochs=2,                # passes over each rollout batch ...
      minibatches=4,           # ... in this many updates each: 8 updates, ratios leave 1
      microbatches=1,
      # True: the update and the rollout forwards run on packed rows (no compute on
      # padding; same values, rljax.train.update.packing). Off by default: on the embedded
      # task (~50-column rows) it saved 4 % per update and each new packed-row bucket cost a
      # ~9 s compile; on long-tailed completions (benchmarks/packing.py) it is 1.8x faster
      pack_sequences=False,
  )


def _algo_regularisers() -> dict:
  """KL to a reference, entropy and token weighting, train-inference mismatch."""
  return dict(
      # KL to a reference policy
      kl_placement="none",     # none | reward | loss
      kl_estimator="low_var_kl",
      kl_coef=0.0,
      kl_controller="fixed",   # fixed | adaptive
      kl_target=0.1,
      kl_horizon=10000,
      reference_offload=False,  # keep the reference params in host memory between uses
      kl_is_correction=False,  # KL-in-loss times the ratio pi/pi_old (unbiased; DeepSeek-V3.2)
      ref_refresh="none",      # none | mix (TR-DPO / TRL sync_ref_model) | reset (ProRL)
      ref_refresh_every=0,     # refresh the reference every N iterations (0: never)
      ref_mix_alpha=0.6,       # mix: ref <- alpha * policy + (1 - alpha) * ref
      ref_reset_optimizer=False,  # reset: also restart the actor's optimizer state
      # entropy and token weighting
      entropy_coef=0.0,
      high_entropy_fraction=0.0,   # 0: off; 0.2 keeps the top-20% entropy tokens
      psr_weight=1.0,              # weight of positive-advantage samples
      nsr_weight=1.0,              # weight of negative-advantage samples
      # train-inference mismatch
      # recompute | sampler | update (the update's own forward pass, under stop-gradient:
      # one forward pass less per iteration; needs 1 update per rollout)
      old_logp_source="recompute",
      # stale samples (sampling.max_staleness > 0): none (PPO against the proximal, i.e.
      # current, policy) | tis (truncated IS weights prox/behaviour, algo.tis_cap) |
      # decoupled (AReaL's decoupled PPO: IS weight prox/behaviour capped at
      # algo.decoupled_cap, clip around the proximal policy; rljax.ops.off_policy)
      off_policy_correction="none",
      decoupled_cap=5.0,
      is_correction="none",         # none | tis | icepop
      is_level="token",             # token | sequence
      tis_cap=2.0,
      icepop_low=0.5,
      icepop_high=2.0,
      # MoE policies: none | sampler (R3, arXiv:2510.11370: the old, reference and current
      # forwards use the experts the sampler chose; the router's weights stay the trainer's)
      routing_replay="none",
      moe_aux_loss_coef=0.0,        # Switch load-balancing loss (arXiv:2101.03961), 0: off
      moe_z_loss_coef=0.0,          # ST-MoE router z-loss (arXiv:2202.08906), 0: off
  )


def _algo_data() -> dict:
  """Reward shaping and filters, the PPO critic, SFT mixing and rejection-sampling phases."""
  return dict(
      # rewards and filters
      reward_norm=False,
      reward_clip=0.0,              # 0: off
      overlong_filter=False,
      soft_overlong=False,
      overlong_cache_len=8,
      length_penalty=0.0,
      missing_eos_penalty=0.0,      # subtracted from the score of truncated samples (TRL)
      repetition_penalty=0.0,       # max n-gram repetition penalty (0: off; Open-R1 / TRL)
      repetition_ngram=3,           # n of that penalty (token n-grams)
      # how the weighted rewards become advantages: sum_then_normalize (the weighted sum
      # is the score of algo.advantage) | normalize_then_sum (GDPO: each reward normalised
      # in its group, weighted sum, batch-normalised; needs algo.advantage='grpo')
      reward_aggregation="sum_then_normalize",
      gdpo_whiten_over="samples",   # GDPO's batch whitening over samples (TRL) | tokens (verl)
      dynamic_sampling=False,
      dynamic_sampling_max_rounds=4,
      # PPO critic
      value_clip=0.2,
      vf_coef=1.0,
      critic_warmup_iterations=0,
      critic_init_path="",          # "": critic trunk from the SFT policy; else a reward model
      ptx_coef=0.0,                 # SFT loss on demonstrations mixed into the RL loss
      # weight of the policy-gradient term; 0 (with ptx_coef or rsft_every) turns the run
      # into an SFT control with RL's sample and update budget (experiments/rl_vs_sft.py)
      pg_coef=1.0,
      # rejection-sampling fine-tuning phases (Llama 2, arXiv:2307.09288, Sec. 3.2.3)
      rsft_every=0,                 # 0: off; N: a phase before every N-th RL iteration (0, N, ..)
      rsft_k=8,                     # K samples per prompt; the best by reward is kept
      rsft_prompts=32,              # prompts per phase
      rsft_steps=2,                 # full-batch NLL steps on the kept completions
      rsft_lr=3e-4,                 # lr of the phase's own AdamW (fresh each phase)
      rsft_min_score=None,          # None: keep every group's best; x: only if best >= x
      # True: the phases sample from the distillation teacher (algo.distill_teacher), not the
      # policy: with rsft_k=1 and rsft_min_score=None, SFT on the teacher's samples
      # (sequence-level KD, Kim & Rush 2016, arXiv:1606.07947)
      rsft_from_teacher=False,
      # multi-turn episodes that did not end by themselves: keep | mask (no loss, still in
      # the group baseline) | drop (no loss, not in the baseline), per status
      on_truncated_episode=ConfigDict(dict(max_turns="keep", length="keep",
                                           env_error="mask", env_timeout="mask")),
      # multi-turn: each turn's step reward on that turn's last sampled token, returns
      # discounted by algo.gamma per turn, advantages against the group's episode returns
      turn_rewards=False,
  )


def _algo_distill() -> dict:
  """On-policy distillation from a frozen teacher (`rljax.ops.distill`)."""
  return dict(
      # "" (off) | an rljax run directory (its config.json and newest checkpoint; the teacher
      # may differ in width and depth, never in tokenizer) | a local Hugging Face directory.
      # "{seed}" is replaced by run.seed (one teacher per seed)
      distill_teacher="",
      # "" | "experiments/FILE.py[:step]": when algo.distill_teacher holds no checkpoint yet,
      # that experiment is first trained into it with this run's seed (once; cached there)
      distill_teacher_recipe="",
      distill_coef=1.0,             # c in the advantage −c·(log π_s − log π_t) (or the penalty)
      # advantage: −c·(log π_s − log π_t) per token, added to the task's advantage | reward:
      # c·(log π_s − log π_t) per token subtracted from the reward (KL-in-reward with the
      # teacher in place of the reference; GRPO sees it summed over the sequence)
      distill_mode="advantage",
      distill_only=False,           # True: the teacher is the only signal (no task reward)
      distill_teacher_dtype="",     # "" (the teacher's own) | float32 | bfloat16
  )
