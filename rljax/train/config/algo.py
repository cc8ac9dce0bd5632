"""The `algo` group: one flat section of the override API, declared as one frozen dataclass per
concern (advantages, clipping, token weights, policy sources and KL, shaping, loss terms,
critic, MoE, schedule, rejection-sampling phases, episodes, distillation).

The fields each registered policy loss and advantage estimator owns come from their
registries beside the kernels (`rljax.ops.policy_loss.POLICY_LOSSES`,
`rljax.ops.estimators.ADVANTAGE_ESTIMATORS`), so a new loss brings its fields with it.
"""

from __future__ import annotations

import dataclasses

from rljax.ops import advantages_group, mismatch
from rljax.ops.aggregate import AGGREGATION_MODES
from rljax.ops.estimators import ADVANTAGE_ESTIMATORS, estimator_fields
from rljax.ops.kl import KL_ESTIMATORS
from rljax.ops.policy_loss import POLICY_LOSSES, RATIO_LEVELS, policy_loss_fields
from rljax.train.config.fields import Group, field, section

TEACHER_DTYPES = ("", "float32", "bfloat16")


@dataclasses.dataclass(frozen=True)
class Advantages(Group):
  """How scores become advantages (`rljax.ops.estimators`)."""

  SECTION = "algo"
  advantage: str = field("grpo", "the advantage estimator", ADVANTAGE_ESTIMATORS)
  adv_eps: float = field(1e-6, "ε of the group std normalisation")
  pass_k: int = field(4, "advantage == 'pass_at_k': k")
  gamma: float = field(1.0, "discount (per token; per turn with turn_rewards)", "[0, 1]")
  lam: float = field(1.0, "GAE's λ", "[0, 1]")
  whiten_advantages: bool = field(False, "whiten the advantages over the batch")
  # normalize_then_sum: GDPO, each reward normalised in its group, weighted sum, whitened
  reward_aggregation: str = field("sum_then_normalize", "normalize_then_sum: GDPO (needs "
                                  "grpo)", ("sum_then_normalize", "normalize_then_sum"))
  gdpo_whiten_over: str = field("samples", "GDPO's batch whitening over samples | tokens",
                                advantages_group.GDPO_WHITEN_OVER)


@dataclasses.dataclass(frozen=True)
class Clipping(Group):
  """The policy loss, its ratio clipping and its aggregation (`rljax.ops.policy_loss`)."""

  SECTION = "algo"
  policy_loss: str = field("ppo", "the policy loss (ppo, cispo, sapo, ...)", POLICY_LOSSES)
  ratio_level: str = field("token", "token | sequence (GSPO) | sequence_token", RATIO_LEVELS)
  eps_low: float = field(0.2, "ratios below 1 - eps_low are clipped", "[0, 1)")
  eps_high: float = field(0.2, "ratios above 1 + eps_high are clipped (DAPO)", ">= 0")
  dual_clip: float = field(0.0, "c bounds the loss of negative advantages", "0 or > 1 (off)")
  ratio_cap: float = field(0.0, "δ caps the unclipped branch (TRL `delta`)", "0 or > 1 (off)")
  loss_agg: str = field("seq_mean_token_mean", "rljax.ops.aggregate", AGGREGATION_MODES)


@dataclasses.dataclass(frozen=True)
class TokenWeightSpec(Group):
  """Per-token and per-row weighting of the update batch."""

  SECTION = "algo"
  psr_weight: float = field(1.0, "weight of positive-advantage samples")
  nsr_weight: float = field(1.0, "weight of negative-advantage samples")
  high_entropy_fraction: float = field(0.0, "0.2 trains the top-20% entropy tokens (0: off)",
                                       "[0, 1]")
  overlong_filter: bool = field(False, "no loss on truncated samples (DAPO)")
  pf_ppo: str = field("none", "PF-PPO batch resampling",
                      ("none", *advantages_group.PF_PPO_METHODS))
  pf_ppo_power: float = field(2.0, "pf_ppo == 'pow': exponent", "> 0")


@dataclasses.dataclass(frozen=True)
class PolicySourcesSpec(Group):
  """Where the old policy's and the reference's log-probs come from, train-inference
  correction, and the KL penalty to the reference."""

  SECTION = "algo"
  # update: the update's own forward pass under stop-gradient (needs 1 update per rollout)
  old_logp_source: str = field("recompute", "the old policy's log-probs",
                               ("recompute", "sampler", "update"))
  is_correction: str = field("none", "train-inference mismatch", ("none", "tis", "icepop"))
  is_level: str = field("token", "token | sequence | geometric", mismatch.LEVELS)
  tis_cap: float = field(2.0, "tis: cap of the importance weight", "> 0")
  icepop_low: float = field(0.5, "icepop: tokens with weights below are masked")
  icepop_high: float = field(2.0, "icepop: tokens with weights above are masked")
  # stale samples (sampling.max_staleness > 0): tis weights prox/behaviour (tis_cap);
  # decoupled: AReaL's decoupled PPO (decoupled_cap; rljax.ops.off_policy)
  off_policy_correction: str = field("none", "stale samples", ("none", "tis", "decoupled"))
  kl_placement: str = field("none", "KL to a reference", ("none", "reward", "loss"))
  kl_estimator: str = field("low_var_kl", "rljax.ops.kl", KL_ESTIMATORS)
  kl_coef: float = field(0.0, "KL coefficient (the controller's start)", ">= 0")
  kl_controller: str = field("fixed", "the KL coefficient's controller", ("fixed", "adaptive"))
  kl_target: float = field(0.1, "adaptive: target KL")
  kl_horizon: int = field(10000, "adaptive: horizon")
  reference_offload: bool = field(False, "keep the reference in host memory between uses")
  ref_refresh: str = field("none", "mix (TR-DPO) | reset (ProRL)", ("none", "mix", "reset"))
  ref_refresh_every: int = field(0, "refresh the reference every N iterations (0: never)")
  ref_mix_alpha: float = field(0.6, "mix: ref <- alpha * policy + (1 - alpha) * ref", "[0, 1]")
  ref_reset_optimizer: bool = field(False, "reset: also restart the actor's optimizer")

  @property
  def has_reference(self) -> bool:
    return self.kl_placement != "none"

  def check(self, c):
    c.need(0 <= self.icepop_low < 1 < self.icepop_high, "icepop_low",
           f"and icepop_high={self.icepop_high} must satisfy 0 <= low < 1 < high")
    placement, off = self.kl_placement, self.off_policy_correction
    rules = (
        (placement != "none" and self.kl_coef == 0 and self.kl_controller == "fixed",
         f"algo.kl_coef=0 with algo.kl_placement={placement!r}: set a coefficient or "
         "kl_placement='none'"),
        (self.reference_offload and placement == "none", "algo.reference_offload=True but "
         "algo.kl_placement='none': there is no reference model to offload"),
        (self.ref_refresh != "none" and placement == "none", f"algo.ref_refresh="
         f"{self.ref_refresh!r} but algo.kl_placement='none': there is no reference model to "
         "refresh"),
        (self.ref_refresh != "none" and not (isinstance(self.ref_refresh_every, int)
                                             and self.ref_refresh_every >= 1),
         f"algo.ref_refresh_every={self.ref_refresh_every!r} must be an int >= 1 when "
         f"algo.ref_refresh={self.ref_refresh!r}"),
        (self.ref_reset_optimizer and self.ref_refresh != "reset",
         "algo.ref_reset_optimizer=True needs algo.ref_refresh='reset'"),
        (off == "tis" and self.is_correction != "none", "algo.off_policy_correction='tis' "
         "weights stale tokens by the truncated ratio to the sampler; algo.is_correction must "
         "be 'none' (it is that weight)"),
        (off != "none" and self.old_logp_source != "recompute", f"algo.off_policy_correction="
         f"{off!r} compares the recomputed (proximal) policy with the sampler's: it needs "
         "algo.old_logp_source='recompute'"))
    c.problems += [message for bad, message in rules if bad]


@dataclasses.dataclass(frozen=True)
class Shaping(Group):
  """What is added to the verifier's score before advantages (`rljax.ops.shaping`)."""

  SECTION = "algo"
  missing_eos_penalty: float = field(0.0, "subtracted from truncated samples' scores", ">= 0")
  repetition_penalty: float = field(0.0, "max n-gram repetition penalty (Open-R1)",
                                    ">= 0 (0: off)")
  repetition_ngram: int = field(3, "n of that penalty (token n-grams)", "int >= 1")
  soft_overlong: bool = field(False, "DAPO's soft overlong punishment")
  overlong_cache_len: int = field(8, "its buffer: the last tokens before the limit")
  length_penalty: float = field(0.0, "penalty per completion token")
  reward_norm: bool = field(False, "normalise the scores over the batch")
  reward_clip: float = field(0.0, "clip the scores to [-c, c] (0: off)")


@dataclasses.dataclass(frozen=True)
class LossTerms(Group):
  """The weights of the loss's terms besides the critic's, and their corrections."""

  SECTION = "algo"
  # 0 (with ptx_coef or rsft_every): an SFT control with RL's budget (experiments/rl_vs_sft.py)
  pg_coef: float = field(1.0, "weight of the policy-gradient term", ">= 0")
  ptx_coef: float = field(0.0, "SFT loss on demonstrations mixed into the RL loss")
  entropy_coef: float = field(0.0, "entropy bonus")
  kl_is_correction: bool = field(False, "KL-in-loss times pi/pi_old (DeepSeek-V3.2)")
  decoupled_cap: float = field(5.0, "decoupled PPO: behaviour weight cap", ">= 0 (0: no cap)")


@dataclasses.dataclass(frozen=True)
class Critic(Group):
  """The PPO critic (`algo.advantage == 'gae'`)."""

  SECTION = "algo"
  value_clip: float = field(0.2, "clip of the value update")
  vf_coef: float = field(1.0, "weight of the value loss")
  critic_warmup_iterations: int = field(0, "iterations training only the critic")
  critic_init_path: str = field("", "'': the trunk of the SFT policy; else a reward model")


@dataclasses.dataclass(frozen=True)
class MoE(Group):
  """Mixture-of-experts policies: routing replay and the router's losses."""

  SECTION = "algo"
  # sampler: R3 (arXiv:2510.11370), the forwards use the experts the sampler chose
  routing_replay: str = field("none", "none | sampler", ("none", "sampler"))
  moe_aux_loss_coef: float = field(0.0, "Switch load-balancing loss (arXiv:2101.03961)",
                                   ">= 0 (0: off)")
  moe_z_loss_coef: float = field(0.0, "ST-MoE router z-loss (arXiv:2202.08906)", ">= 0 (0: off)")


@dataclasses.dataclass(frozen=True)
class Schedule(Group):
  """How rollouts are drawn and consumed: dynamic sampling, epochs, (micro-)batches."""

  SECTION = "algo"
  dynamic_sampling: bool = field(False, "resample groups with equal scores (DAPO)")
  dynamic_sampling_max_rounds: int = field(4, "its generation rounds per iteration")
  epochs: int = field(2, "passes over each rollout batch ...", ">= 1")
  minibatches: int = field(4, "... in this many updates each", ">= 1")
  microbatches: int = field(1, "gradient-accumulation steps per update", ">= 1")
  # on long-tailed completions 1.8x faster (benchmarks/packing.py); a bucket costs a compile
  pack_sequences: bool = field(False, "forwards on packed rows (rljax.train.update.packing)")

  def check(self, c):
    c.need(not self.dynamic_sampling or self.dynamic_sampling_max_rounds >= 1,
           "dynamic_sampling_max_rounds", "must be >= 1 (dynamic sampling's rounds)")


@dataclasses.dataclass(frozen=True)
class RejectionSFTSpec(Group):
  """Rejection-sampling fine-tuning phases (Llama 2, arXiv:2307.09288, Sec. 3.2.3); its own
  spec (`ScheduleSpec.rsft`, None when `rsft_every` is 0)."""

  SECTION = "algo"
  rsft_every: int = field(0, "a phase before every N-th RL iteration", "int >= 0 (0: off)")
  rsft_k: int = field(8, "K samples per prompt; the best by reward is kept")
  rsft_prompts: int = field(32, "prompts per phase")
  rsft_steps: int = field(2, "full-batch NLL steps on the kept completions")
  rsft_lr: float = field(3e-4, "lr of the phase's own AdamW (fresh each phase)")
  rsft_min_score: float | None = field(None, "None: keep every best; x: only if best >= x")
  # with rsft_k=1: sequence-level KD (Kim & Rush 2016, arXiv:1606.07947)
  rsft_from_teacher: bool = field(False, "sample the phases from algo.distill_teacher")

  def check(self, c):
    if not isinstance(self.rsft_every, int) or self.rsft_every <= 0:
      return
    for name in ("rsft_k", "rsft_prompts", "rsft_steps"):
      value = getattr(self, name)
      c.need(isinstance(value, int) and value >= 1, name,
             "must be an int >= 1 when algo.rsft_every > 0")
    c.need(self.rsft_lr > 0, "rsft_lr", "must be > 0")
    c.need(self.rsft_min_score is None or isinstance(self.rsft_min_score, (int, float)),
           "rsft_min_score", "must be None or a number")


@dataclasses.dataclass(frozen=True)
class Episodes(Group):
  """Multi-turn episodes (`task.env`): truncated episodes and per-turn credit."""

  SECTION = "algo"
  # keep | mask (no loss, still in the group baseline) | drop (no loss, not in the baseline)
  on_truncated_episode: dict = field(dict(max_turns="keep", length="keep",
                                          env_error="mask", env_timeout="mask"),
                                     "per status: what an unfinished episode contributes")
  turn_rewards: bool = field(False, "each turn's reward on its last token (algo.gamma per turn)")

  def check(self, c):
    for status, what in self.on_truncated_episode.items():
      if what not in ("keep", "mask", "drop"):
        c.problems.append(f"algo.on_truncated_episode.{status}={what!r} must be keep | mask | "
                          "drop")


@dataclasses.dataclass(frozen=True)
class Distill(Group):
  """On-policy distillation from a frozen teacher (`rljax.ops.distill`)."""

  SECTION = "algo"
  # a run directory or a Hugging Face directory (same tokenizer); "{seed}" is run.seed
  distill_teacher: str = field("", "the teacher ('': off)")
  distill_teacher_recipe: str = field("", "'experiments/FILE.py[:step]' trains the teacher")
  distill_coef: float = field(1.0, "c in the advantage -c·(log π_s - log π_t)")
  # reward: c·(log π_s - log π_t) per token subtracted from the reward (KL-in-reward)
  distill_mode: str = field("advantage", "advantage | reward", ("advantage", "reward"))
  distill_only: bool = field(False, "the teacher is the only signal (no task reward)")
  distill_teacher_dtype: str = field("", "the teacher's dtype ('': its own)", TEACHER_DTYPES)

  def check(self, c):
    coef = self.distill_coef
    c.need(isinstance(coef, (int, float)) and not isinstance(coef, bool) and coef >= 0,
           "distill_coef", "must be a number >= 0")
    if not self.distill_teacher:
      for on, what in ((self.distill_only, "algo.distill_only=True"),
                       (self.distill_teacher_recipe, "algo.distill_teacher_recipe")):
        if on:
          c.problems.append(f"{what} needs a teacher: set algo.distill_teacher")
    elif self.distill_only and not coef:
      c.problems.append("algo.distill_only=True with algo.distill_coef=0 leaves nothing to "
                        "train the policy")


CONCERNS = (Advantages, Clipping, TokenWeightSpec, PolicySourcesSpec, Shaping, LossTerms,
            Critic, MoE, Schedule, RejectionSFTSpec, Episodes, Distill)


def algo_section():
  """The `algo` section: every concern's fields, then the registries' own fields."""
  return section(*CONCERNS, **policy_loss_fields(), **estimator_fields())
