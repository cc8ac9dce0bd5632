"""One RL iteration: rollout -> score -> old/ref log-probs and values -> advantages -> updates."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rljax import parallel
from rljax.analysis import token_statistics
from rljax.ops import advantages_group, masks, mismatch, shaping
from rljax.ops import kl as kl_ops
from rljax.ops.stats import masked_mean
from rljax.parallel import batch_sharding
from rljax.train import objective, offload, packing, rollout
from rljax.train.advantages import compute_advantages, gdpo_terms
from rljax.train.sft import demonstration_batch
from rljax.train.update import has_reference, policy_params, split_micro

SEQUENCE_KEYS = ("prompt_tokens", "prompt_mask", "tokens", "mask")
UPDATE_KEYS = ("prompt_tokens", "prompt_mask", "tokens", "mask", "old_logp", "ref_logp",
               "advantages", "returns", "old_values", "token_weights", "is_weights", "rng")


def in_micro_batches(fn, num_micro: int):
  """fn(params, batch) run over `num_micro` consecutive row chunks in a `lax.map` (one
  chunk's activations live at a time), outputs concatenated back in row order."""
  if num_micro == 1:
    return fn

  def chunked(params, batch):
    rows = jax.tree.leaves(batch)[0].shape[0]
    if rows % num_micro:
      raise ValueError(f"algo.microbatches={num_micro} must divide the {rows} rollout rows")
    out = jax.lax.map(lambda chunk: fn(params, chunk), split_micro(batch, num_micro))
    return jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), out)
  return chunked


class ForwardFns:
  """Jitted forward passes over a whole rollout batch (compiled once per run), in
  `algo.microbatches` chunks like the update step, so they do not set the memory peak."""

  def __init__(self, setup):
    temperature, pack_groups = setup.loss_spec.temperature, setup.loss_spec.pack_groups
    actor_gd, critic_gd = setup.actor_graphdef, setup.critic_graphdef

    def policy_forward(params, batch):
      return objective.policy_forward(nnx.merge(actor_gd, params), batch, temperature=temperature,
                                      pack_groups=pack_groups)

    def value_forward(params, batch):
      return objective.value_forward(nnx.merge(critic_gd, params), batch)

    def sum_sq_forward(params, batch):
      return objective.policy_sum_sq_forward(nnx.merge(actor_gd, params), batch,
                                             temperature=temperature)

    policy_stats = jax.jit(in_micro_batches(policy_forward, setup.num_micro))
    values = jax.jit(in_micro_batches(value_forward, setup.num_micro))
    # (log-probs, Σπ²) for the optimal token baseline; compiled only when that mode calls it
    self.policy_sum_sq = jax.jit(in_micro_batches(sum_sq_forward, setup.num_micro))
    self.policy_stats, self.values = policy_stats, values
    self.setup = setup

  def sequences(self, batch, lengths):
    """The forwards' input: the four sequence arrays of `batch`, plus the packing layout
    of its rows when the run packs (`lengths`: host prompt_lengths and lengths)."""
    out = {k: batch[k] for k in SEQUENCE_KEYS}
    if self.setup.loss_spec.pack_groups:
      out.update(pack_batch(self.setup, lengths, out["tokens"].shape[1],
                            out["prompt_tokens"].shape[1]))
    return out

  def compile_count(self):
    return (self.policy_stats._cache_size() + self.values._cache_size()
            + self.policy_sum_sq._cache_size())


def iteration_keys(state, iteration):
  base = jax.random.fold_in(jax.random.wrap_key_data(state.rng), iteration)
  return dict(zip(("sample", "update", "greedy"), jax.random.split(base, 3)))


def draw_prompts_fn(setup):
  """Draws from the run's prompt sampler (its state is checkpointed with the run)."""
  prompts = setup.task.train_prompts()
  return lambda k: [prompts[i] for i in setup.prompt_sampler.sample(k)]


def feed_back_success(setup, prompts, accuracy, n):
  """Per-prompt success rates to the sampler (prioritized sampling tracks them online)."""
  index = np.asarray([setup.prompt_index[p.id] for p in prompts])
  setup.prompt_sampler.update(index, np.asarray(accuracy).reshape(-1, n).mean(axis=1))


def shape_scores(config, rows, moments):
  """Soft overlong punishment, length penalty, missing-EOS and n-gram repetition penalties,
  reward normalisation and clipping."""
  a, s = config.algo, config.sampling
  scores = jnp.asarray(rows["scores"])
  lengths = jnp.asarray(rows["lengths"])
  if a.missing_eos_penalty:
    scores = scores + shaping.missing_eos_penalty(jnp.asarray(rows["truncated"]),
                                                  penalty=a.missing_eos_penalty)
  if a.repetition_penalty:
    scores = scores + shaping.ngram_repetition_penalty(
        rows["tokens"], rows["mask"], n=a.repetition_ngram, max_penalty=a.repetition_penalty)
  if a.soft_overlong:
    scores = scores + shaping.soft_overlong_penalty(lengths, max_len=s.max_new_tokens,
                                                    cache_len=a.overlong_cache_len)
  if a.length_penalty:
    scores = scores + shaping.length_penalty(
        lengths.reshape(-1, s.n), jnp.asarray(rows["accuracy"]).reshape(-1, s.n),
        coef=a.length_penalty).reshape(-1)
  if a.reward_norm:
    moments = moments.update(scores, jnp.ones_like(scores))
    scores = shaping.normalize_rewards(scores, moments)
  if a.reward_clip:
    scores = shaping.clip_rewards(scores, clip=a.reward_clip)
  return scores, moments


def correction_weights(config, old_logp, sampler_logp, mask):
  """Train-inference correction weights (TIS / IcePop) per token, or ones."""
  a = config.algo
  if a.is_correction == "none" or a.old_logp_source == "sampler":
    return jnp.ones_like(old_logp)
  if a.is_correction == "tis":
    return mismatch.truncated_is_weights(old_logp, sampler_logp, mask, cap=a.tis_cap,
                                         level=a.is_level)
  return mismatch.icepop_weights(old_logp, sampler_logp, mask, low=a.icepop_low,
                                 high=a.icepop_high, level=a.is_level)


def prepare(setup, fns, state, rows, keys, moments):
  """Everything the update needs, as device arrays; plus rollout metrics."""
  c = setup.config
  a = c.algo
  # Global arrays from the rollout stay where they are; host rows (dynamic sampling) are
  # placed, every process holding the same values.
  rows_sharding = batch_sharding(setup.mesh)
  batch = {k: jax.device_put(rows[k], rows_sharding) for k in SEQUENCE_KEYS}
  # completion extent (multi-turn: sampled and observation tokens) for the packing layout
  lengths = {"prompt_lengths": np.asarray(rows["prompt_lengths"]),
             "lengths": np.asarray(rows.get("extent", rows["lengths"]))}
  sequences = fns.sequences(batch, lengths)   # (+ the packing layout when the run packs)
  sampler_logp = jax.device_put(rows["sampler_logp"], rows_sharding)
  mask = batch["mask"].astype(jnp.float32)
  if a.old_logp_source == "update":   # filled in by the update step (`fill_from_update`)
    old_logp = entropy = jnp.zeros_like(sampler_logp)
  else:
    old_logp, entropy = fns.policy_stats(policy_params(state), sequences)
  if a.old_logp_source == "sampler":
    old_logp = sampler_logp
  batch["old_logp"] = old_logp
  if state.ref is not None:   # (host-offloaded parameters visit the devices just for this)
    batch["ref_logp"] = fns.policy_stats(offload.fetch(state.ref, state.actor), sequences)[0]
  elif has_reference(state, a.kl_placement):   # LoRA: the base, adapters off
    batch["ref_logp"] = fns.policy_stats(policy_params(state, adapters=False), sequences)[0]
  else:
    batch["ref_logp"] = old_logp
  batch["values"] = (fns.values(state.critic, sequences) if state.critic is not None
                     else jnp.zeros_like(old_logp))
  scores, moments = shape_scores(c, rows, moments)
  keep_loss, valid = episode_policy(a, rows, scores.shape[0])
  batch["scores"], batch["valid"] = scores, jnp.asarray(valid)
  if setup.adv_spec.reward_weights:   # GDPO: the weighted components, shaping as one more
    batch["reward_components"] = reward_components(setup, rows, scores)
  if a.advantage == "remax":
    batch["greedy_scores"] = jnp.asarray(rows["greedy_scores"])
  if a.advantage == "optimal_token_baseline":   # the sampling policy's Σπ² per token
    batch["sampled_logp"], batch["sum_sq"] = fns.policy_sum_sq(policy_params(state), sequences)
  adv, returns, kl_bt = compute_advantages(setup.adv_spec, batch, state.kl_coef)
  if a.turn_rewards and "episodes" in rows:   # per-turn rewards and returns (multi-turn)
    from rljax.train.multiturn import turn_advantages
    adv = jnp.asarray(turn_advantages(
        rows["episodes"], np.asarray(scores), np.asarray(rows["reward/env"]),
        np.asarray(batch["mask"]), group=c.sampling.n, gamma=float(a.gamma)),
        jnp.float32) * batch["valid"][:, None]
    adv = jax.device_put(adv, rows_sharding)
    returns = adv
  weights = token_weights(a, adv, entropy, mask)
  loss_mask = batch["mask"] * jnp.asarray(keep_loss, batch["mask"].dtype)[:, None]
  if a.overlong_filter:
    loss_mask = masks.overlong_filter_mask(loss_mask, jnp.asarray(rows["truncated"]))
  b = mask.shape[0]
  upd = dict(prompt_tokens=batch["prompt_tokens"], prompt_mask=batch["prompt_mask"],
             scores=scores, truncated=jnp.asarray(rows["truncated"]), entropy=entropy,
             tokens=batch["tokens"], mask=loss_mask, old_logp=old_logp,
             ref_logp=batch["ref_logp"], advantages=adv, returns=returns,
             old_values=batch["values"], token_weights=weights,
             is_weights=correction_weights(c, old_logp, sampler_logp, mask),
             rng=jax.random.key_data(jax.random.split(keys["update"], b)),
             sampler_logp=sampler_logp, completion_mask=batch["mask"], **lengths)
  if "reward_components" in batch:
    upd["reward_components"] = batch["reward_components"]
  metrics = rollout_metrics(rows, scores, adv, mask, loss_mask, state.kl_coef)
  if "episode_metrics" in rows:   # multi-turn: turns, tools, terminations, per-turn logp gap
    from rljax.train.multiturn import turn_logp_gap
    metrics.update(rows["episode_metrics"])
    if a.old_logp_source != "sampler":
      metrics.update(turn_logp_gap(rows["episodes"], np.asarray(sampler_logp),
                                   np.asarray(old_logp), np.asarray(batch["mask"])))
  if a.old_logp_source != "update":
    metrics.update(old_policy_metrics(upd, with_ref=has_reference(state, a.kl_placement)))
  if a.pf_ppo != "none":
    upd, metrics["train/pf_ppo_unique_frac"] = pf_ppo_filter(a, upd, keys["update"])
  if state.critic is not None:
    resid = masked_mean(jnp.square(returns - batch["values"]), mask)
    var = masked_mean(jnp.square(returns - masked_mean(returns, mask)), mask)
    metrics["critic/explained_variance"] = float(1.0 - resid / jnp.maximum(var, 1e-8))
  return upd, metrics, moments


def reward_components(setup, rows, shaped_scores):
  """[B, K] unweighted reward components in `gdpo_terms` order; the last one is what
  shaping added to the weighted sum."""
  names, _ = gdpo_terms(setup.ctx.reward_fn)
  cols = [np.asarray(rows[f"{rollout.REWARD_PREFIX}{n}"], np.float32) for n in names[:-1]]
  shaping_delta = np.asarray(shaped_scores, np.float32) - np.asarray(rows["scores"], np.float32)
  return jnp.asarray(np.stack(cols + [shaping_delta], axis=1))


def episode_policy(algo, rows, b):
  """(keep-loss [B], valid [B]) floats from the episodes' statuses and
  `algo.on_truncated_episode` (all ones for single-turn rollouts): "mask" rows carry no
  loss but stay in their group's baseline; "drop" rows are not in the baseline either."""
  keep, valid = np.ones(b, np.float32), np.ones(b, np.float32)
  if "status" not in rows:
    return keep, valid
  from rljax.envs import STATUSES
  for code, name in enumerate(STATUSES):
    what = algo.on_truncated_episode.get(name, "keep")
    rows_of = np.asarray(rows["status"]) == code
    if what in ("mask", "drop"):
      keep[rows_of] = 0.0
    if what == "drop":
      valid[rows_of] = 0.0
  return keep, valid


def pack_batch(setup, lengths, completion_width, prompt_width, index=None):
  """The packing layout (`rljax.train.packing`) of the rows `index` of a batch, placed like
  its rows: one group per (micro-batch, data shard)."""
  take = (lambda x: x) if index is None else (lambda x: x[index])  # noqa: E731
  groups = setup.num_micro * setup.loss_spec.pack_groups
  layout = packing.pack_layout(take(lengths["prompt_lengths"]), take(lengths["lengths"]),
                               prompt_width=prompt_width, completion_width=completion_width,
                               groups=groups)
  sharding = batch_sharding(setup.mesh)
  return {k: jax.device_put(v, sharding) for k, v in packing.layout_arrays(layout).items()}


def pf_ppo_filter(algo, upd, key):
  """PF-PPO: the update batch resampled with replacement, P(row) ∝ w(score) (verl
  `pf_ppo`); returns (batch, fraction of distinct rows kept)."""
  weights = advantages_group.pf_ppo_weights(upd["scores"], method=algo.pf_ppo,
                                            power=algo.pf_ppo_power)
  index = np.asarray(advantages_group.pf_ppo_resample(jax.random.fold_in(key, 0x9F), weights))
  unique = len(np.unique(index)) / index.shape[0]
  return {k: v[index] for k, v in upd.items()}, unique


def token_weights(algo, adv, entropy, mask):
  """Per-token loss weights: PSR/NSR sample weights and the high-entropy token mask, or 1."""
  weights = jnp.ones_like(adv)
  if algo.psr_weight != 1.0 or algo.nsr_weight != 1.0:
    weights = weights * masks.psr_nsr_weights(adv, positive_weight=algo.psr_weight,
                                              negative_weight=algo.nsr_weight)
  if algo.high_entropy_fraction > 0:
    weights = weights * masks.high_entropy_mask(entropy, mask,
                                                top_fraction=algo.high_entropy_fraction)
  return weights


def rollout_metrics(rows, scores, adv, mask, loss_mask, kl_coef):
  """Reward, accuracy, length and batch metrics of one rollout (host floats)."""
  return {
      "train/reward": float(jnp.mean(scores)), "train/raw_score": float(np.mean(rows["scores"])),
      "train/accuracy": float(np.mean(rows["accuracy"])),
      "train/format": float(np.mean(rows["format"])),
      "train/reward_failures": int(np.sum(rows["reward_failed"])),
      **{k: float(np.nanmean(v)) if np.isfinite(v).any() else float("nan")
         for k, v in ((k, np.asarray(v, np.float64)) for k, v in rows.items()
                      if k.startswith(rollout.REWARD_PREFIX))},
      "train/response_length_mean": float(np.mean(rows["lengths"])),
      "train/response_length_max": float(np.max(rows["lengths"])),
      "train/truncated_frac": float(np.mean(rows["truncated"])),
      **length_metrics(rows, loss_mask),
      "train/advantage_abs_mean": float(masked_mean(jnp.abs(adv), mask)),
      "train/effective_batch": float(jnp.sum(jnp.any(loss_mask > 0, axis=1) &
                                             jnp.any(adv != 0, axis=1))),
      "kl/coef": float(kl_coef),
  }


def length_metrics(rows, loss_mask):
  """Length tail and length by outcome (DAPO Figs. 4-5; Dr. GRPO Sec. 3.1: a sequence-mean
  loss lets incorrect answers grow) and the loss tokens truncated rows still carry (0 under
  overlong filtering). NaN when no row of that outcome exists."""
  lengths = np.asarray(rows["lengths"], np.float64)
  correct = np.asarray(rows["accuracy"]) > 0
  def mean_or_nan(x):
    return float(np.mean(x)) if x.size else float("nan")
  return {"train/response_length_p90": float(np.percentile(lengths, 90)),
          "train/length_correct": mean_or_nan(lengths[correct]),
          "train/length_incorrect": mean_or_nan(lengths[~correct]),
          "train/truncated_loss_tokens": float(jnp.sum(
              (loss_mask > 0) & jnp.asarray(rows["truncated"], bool)[:, None]))}


def old_policy_metrics(upd, *, with_ref):
  """Rollout metrics that need the old policy's log-probs and entropies (in `upd`)."""
  mask = upd["completion_mask"].astype(jnp.float32)
  old_logp, entropy = upd["old_logp"], upd["entropy"]
  gap = (old_logp - upd["sampler_logp"]) * mask
  metrics = {
      "train/entropy_rollout": float(masked_mean(entropy, mask)),
      "mismatch/logp_gap_mean": float(jnp.sum(jnp.abs(gap)) / jnp.maximum(jnp.sum(mask), 1)),
      "mismatch/logp_gap_max": float(jnp.max(jnp.abs(gap))),
  }
  metrics.update(token_statistics(*parallel.gather((old_logp, entropy, upd["advantages"],
                                                    upd["mask"]))))
  if with_ref:
    kl_ref = kl_ops.kl_estimate(old_logp, upd["ref_logp"], "k3")
    metrics["kl/to_ref"] = float(masked_mean(kl_ref, mask))
  return metrics


def ptx_batch(setup, size, *, seed):
  """Demonstrations mixed into the RL loss (InstructGPT's PPO-ptx), drawn reproducibly."""
  prompts = setup.task.train_prompts()
  rng = np.random.default_rng([setup.config.run.seed, 7, *seed])
  chosen = [prompts[i] for i in rng.integers(0, len(prompts), size)]
  return demonstration_batch(setup.ctx, chosen, setup.config.sampling.max_new_tokens)


def run_updates(setup, state, upd, keys, *, train_actor, iteration):
  """`epochs × minibatches` update steps over a shuffled batch; returns (state, mean metrics)."""
  a = setup.config.algo
  b = upd["mask"].shape[0]
  per_mb = b // a.minibatches
  sums, count = {}, 0
  for epoch in range(a.epochs):
    perm = jax.random.permutation(jax.random.fold_in(keys["update"], epoch), b)
    for m in range(a.minibatches):
      index = perm[m * per_mb:(m + 1) * per_mb]
      minibatch = {k: upd[k][index] for k in UPDATE_KEYS}
      if setup.loss_spec.pack_groups:
        minibatch.update(pack_batch(setup, upd, upd["tokens"].shape[1],
                                    upd["prompt_tokens"].shape[1], np.asarray(index)))
      minibatch["kl_coef"] = jnp.copy(state.kl_coef)   # own buffer: the state is donated
      if a.ptx_coef:
        minibatch["ptx"] = ptx_batch(setup, per_mb, seed=(iteration, epoch, m))
      state, metrics = setup.update_step(state, minibatch, jnp.asarray(train_actor))
      per_token = metrics.pop(objective.TOKEN_OUTPUTS, None)
      if per_token is not None:   # old_logp_source="update": one minibatch, rows in `index`
        inverse = jnp.argsort(index)
        upd["old_logp"], upd["entropy"] = (per_token[k][inverse] for k in ("old_logp", "entropy"))
      for k, v in metrics.items():
        sums[k] = sums.get(k, 0.0) + float(v)
      count += 1
  return state, {f"update/{k}": v / count for k, v in sums.items()}


def rl_iteration(setup, fns, state, iteration, moments, model):
  """Runs one iteration; returns (state, metrics, moments, update batch)."""
  c = setup.config
  keys = iteration_keys(state, iteration)
  t0 = time.perf_counter()
  counter = iter(range(1_000_000))
  rows, prompts, stats = rollout.collect(
      setup.ctx, model, draw_prompts_fn(setup),
      lambda: jax.random.fold_in(keys["sample"], next(counter)),
      num_prompts=c.sampling.prompts_per_iteration, dynamic_sampling=c.algo.dynamic_sampling,
      max_rounds=c.algo.dynamic_sampling_max_rounds if c.algo.dynamic_sampling else 1)
  feed_back_success(setup, prompts, rows["accuracy"], c.sampling.n)
  if c.algo.advantage == "remax":
    greedy = setup.ctx.sampling.replace(greedy=True, n=1)
    g_rows = rollout.score(setup.ctx, prompts,
                           rollout.sample(setup.ctx, model, prompts, keys["greedy"],
                                          sampling=greedy), 1)
    rows["greedy_scores"] = np.repeat(g_rows["scores"], c.sampling.n)
  t1 = time.perf_counter()
  upd, metrics, moments = prepare(setup, fns, state, rows, keys, moments)
  train_actor = iteration >= c.algo.critic_warmup_iterations
  state, update_metrics = run_updates(setup, state, upd, keys, train_actor=train_actor,
                                      iteration=iteration)
  if c.algo.old_logp_source == "update":
    metrics.update(old_policy_metrics(upd, with_ref=has_reference(state, c.algo.kl_placement)))
  if c.algo.kl_controller == "adaptive" and has_reference(state, c.algo.kl_placement):
    ctl = kl_ops.AdaptiveKLController(value=state.kl_coef, target=c.algo.kl_target,
                                      horizon=c.algo.kl_horizon)
    new_coef = ctl.update(metrics.get("kl/to_ref", 0.0), upd["mask"].shape[0]).value
    state = state._replace(kl_coef=_like(state.kl_coef, new_coef))
  t2 = time.perf_counter()
  tokens = float(np.sum(rows["lengths"]))
  metrics.update(stats)
  metrics.update(update_metrics)
  metrics.update({"time/rollout_s": t1 - t0, "time/update_s": t2 - t1,
                  "time/tokens_per_s": tokens / max(stats["time/generate_s"], 1e-9)})
  state = state._replace(iteration=_like(state.iteration, iteration + 1))
  return state, metrics, moments, upd


def save_analysis_batch(fns, state, upd, path):
  """The last rollout batch with the updated policy's log-probs, for `rljax.analysis`
  (the notebook's trick-impact view on a real batch)."""
  logp, _ = fns.policy_stats(policy_params(state), fns.sequences(upd, upd))
  arrays = {"logp": logp, "old_logp": upd["old_logp"], "entropy": upd["entropy"],
            "advantages": upd["advantages"], "mask": upd["mask"], "scores": upd["scores"],
            "truncated": upd["truncated"], "tokens": upd["tokens"]}
  if "reward_components" in upd:   # GDPO: the unweighted rewards it normalised, [B, K]
    arrays["reward_components"] = upd["reward_components"]
  arrays = parallel.gather(arrays)   # a collective: every process calls this
  if parallel.is_primary():
    np.savez(path, **arrays)


def _like(old, value):
  """`value` with the dtype and sharding of `old` (keeps the update step's cache warm)."""
  return jax.device_put(jnp.asarray(value, old.dtype), old.sharding)
