"""Checks of the rollout's settings: multi-turn episodes, and asynchronous rollouts on the
sampler's own devices (called by `rljax.train.config.checks.check_combinations`)."""

from __future__ import annotations

import jax


def _check(errors, ok, message):
  if not ok:
    errors.append(message)


def check_env(errors, c):
  """task.env and the multi-turn sampling fields."""
  t, s, a = c.task, c.sampling, c.algo
  _check(errors, isinstance(s.max_turns, int) and s.max_turns >= 1,
         f"sampling.max_turns={s.max_turns!r} must be an int >= 1")
  _check(errors, isinstance(s.max_observation_tokens, int) and s.max_observation_tokens >= 0,
         f"sampling.max_observation_tokens={s.max_observation_tokens!r} must be an int >= 0")
  if any(not isinstance(x, str) or not x for x in s.turn_stop):
    errors.append(f"sampling.turn_stop={list(s.turn_stop)!r} must be non-empty strings")
  for status, what in a.on_truncated_episode.items():
    if what not in ("keep", "mask", "drop"):
      errors.append(f"algo.on_truncated_episode.{status}={what!r} must be keep | mask | drop")
  if a.turn_rewards and (not t.env or a.advantage != "grpo"):
    errors.append("algo.turn_rewards=True puts each turn's reward on its own tokens: it needs "
                  f"task.env and algo.advantage='grpo' (got {t.env!r}, {a.advantage!r})")
  _check(errors, isinstance(s.max_total_tokens, int) and s.max_total_tokens >= 0,
         f"sampling.max_total_tokens={s.max_total_tokens!r} must be an int >= 0 (0: "
         "sampling.max_new_tokens)")
  if not t.env and s.max_total_tokens:
    errors.append("sampling.max_total_tokens is a multi-turn episode's budget: it needs "
                  "task.env (single-turn runs use sampling.max_new_tokens)")
  if not t.env:
    if s.max_turns > 1 or list(s.turn_stop):
      errors.append("sampling.max_turns / sampling.turn_stop need task.env (an environment "
                    "that answers each turn)")
    return
  if ":" not in t.env:
    errors.append(f"task.env={t.env!r}: expected 'module.path:factory' or 'file.py:factory'")
  if not list(s.turn_stop) and s.max_turns > 1:
    errors.append("task.env with sampling.max_turns > 1 needs sampling.turn_stop (the strings "
                  "that end a turn, e.g. ['</call>'])")
  if a.dynamic_sampling:
    errors.append("algo.dynamic_sampling is not supported with task.env (multi-turn episodes)")
  if a.advantage == "remax":
    errors.append("algo.advantage='remax' (a greedy single-turn baseline) is not supported "
                  "with task.env")
  if c.parallel.fsdp != 1 or c.parallel.tensor != 1:
    errors.append("task.env runs the episodes' rows data-parallel only: parallel.fsdp and "
                  "parallel.tensor must be 1")
  if jax.process_count() > 1:
    errors.append(f"task.env runs on one process (this run has {jax.process_count()}): the "
                  "environments step on the host that samples, and rows are not yet split "
                  "over processes")


def check_async(errors, c):
  """sampling.max_staleness, algo.off_policy_correction and the sampler's own devices."""
  s, a, p = c.sampling, c.algo, c.parallel
  k = s.max_staleness
  if not isinstance(k, int) or k < 0:
    errors.append(f"sampling.max_staleness={k!r} must be an int >= 0 (0: synchronous)")
    return
  if a.off_policy_correction == "decoupled" and a.policy_loss != "ppo":
    errors.append("algo.off_policy_correction='decoupled' is AReaL's decoupled PPO clip: it "
                  f"needs algo.policy_loss='ppo' (got {a.policy_loss!r})")
  if a.off_policy_correction == "decoupled" and a.ratio_cap:
    errors.append("algo.off_policy_correction='decoupled' has its own cap on the behaviour "
                  "weight (algo.decoupled_cap): set algo.ratio_cap=0")
  if a.off_policy_correction == "tis" and a.is_correction != "none":
    errors.append("algo.off_policy_correction='tis' weights stale tokens by the truncated "
                  "ratio to the sampler; algo.is_correction must be 'none' (it is that weight)")
  if a.off_policy_correction != "none" and a.old_logp_source != "recompute":
    errors.append(f"algo.off_policy_correction={a.off_policy_correction!r} compares the "
                  "recomputed (proximal) policy with the sampler's: it needs "
                  "algo.old_logp_source='recompute'")
  if a.decoupled_cap < 0:
    errors.append(f"algo.decoupled_cap={a.decoupled_cap} must be >= 0 (0: no cap)")
  if k > 0:
    blocked = [(bool(c.task.env), "task.env (multi-turn episodes)"),
               # two threads issuing collectives cannot be ordered alike on every process
               (jax.process_count() > 1, f"{jax.process_count()} processes"),
               (a.rsft_every > 0, "algo.rsft_every (rejection-sampling phases)"),
               (a.old_logp_source != "recompute",
                f"algo.old_logp_source={a.old_logp_source!r}")]
    for bad, what in blocked:
      if bad:
        errors.append(f"sampling.max_staleness={k} samples in the background: {what} is not "
                      "supported with it (set sampling.max_staleness=0)")
  if s.partial_rollouts:
    _check_partial_rollouts(errors, c)
  if not isinstance(p.sampler_devices, int) or p.sampler_devices < 0:
    errors.append(f"parallel.sampler_devices={p.sampler_devices!r} must be an int >= 0 "
                  "(0: colocated)")
  elif p.sampler_devices and (p.sampler_tensor < 1 or p.sampler_devices % p.sampler_tensor):
    errors.append(f"parallel.sampler_tensor={p.sampler_tensor} must divide "
                  f"parallel.sampler_devices={p.sampler_devices}")


def _check_partial_rollouts(errors, c):
  """sampling.partial_rollouts: single-turn rollouts over k + 1 segments, one round each."""
  s, a, k = c.sampling, c.algo, c.sampling.max_staleness
  blocked = [(k == 0, "sampling.max_staleness=0 (no weight handoff happens mid-request: "
                      "set it >= 1)"),
             (a.dynamic_sampling, "algo.dynamic_sampling (its extra rounds)"),
             (a.advantage == "remax", "algo.advantage='remax' (its greedy rollout)"),
             (s.max_new_tokens < k + 1,
              f"sampling.max_new_tokens={s.max_new_tokens} < k + 1 = {k + 1} segments")]
  for bad, what in blocked:
    if bad:
      errors.append(f"sampling.partial_rollouts=True is not supported with {what}")
