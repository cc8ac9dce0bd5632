"""Multi-turn episodes: exact tool-call / failure / termination counts from a scripted
environment, token-in-token-out (mask, log-prob parity with the trainer), extend-prefill
equals a fresh prefill, statuses, and the trainer (resume, 1 vs 8 devices)."""

import json
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tolerances import assert_close_f32, f32_atol
from train_micro import micro_config, read_records

from rljax.envs import Step
from rljax.models import Decoder
from rljax.models.testing import perturb_params, tiny_config
from rljax.ops.turns import turn_advantages
from rljax.sampling.multiturn import TurnSpec
from rljax.train.config.specs import EpisodeSpec
from rljax.train.loop import train
from rljax.train.rollout.batch import EpisodeRecords, turn_inputs
from rljax.train.rollout.environments import Episode, episode_metrics
from rljax.train.rollout.episodic import run_episodes
from rljax.train.run.build import build
from rljax.train.update import objective


def _episode(max_turns, max_observation_tokens, timeout):
  return EpisodeSpec(env="", max_turns=max_turns, turn_stop=(),
                     max_observation_tokens=max_observation_tokens, env_timeout=timeout,
                     env_reward_only=False, on_truncated_episode=(), turn_rewards=False,
                     gamma=1.0)

SCRIPTS = {
    0: [Step("12", info={"tool_call": True}), Step("x", info={"error": True}),
        Step(done=True, info={"tool_call": False})],
    1: [Step("1"), RuntimeError("tool crashed")],
    2: [Step("a")] * 10,
    3: ["hang"],
    4: [Step("abcdefghijklmnopqrstuvwxyz")],
    5: "reset fails",
}


class ScriptedEnv:
  def __init__(self, prompt):
    self.script = SCRIPTS[int(prompt.id)]
    self.k = 0

  def reset(self, prompt):
    if self.script == "reset fails":
      raise ValueError("no such episode")
    return ""

  def step(self, action):
    item = self.script[self.k]
    self.k += 1
    if item == "hang":
      time.sleep(2.0)
    if isinstance(item, Exception):
      raise item
    return item


def _ctx(tmp_path):
  config = micro_config("grpo", tmp_path, **{"sampling.max_new_tokens": 12})
  return build(config).ctx


def _prompts(ctx, count):
  from rljax.data import Prompt
  return [Prompt(str(i), f"Q:{i}+1\n", str(i + 1), 1) for i in range(count)]


def test_scripted_environment_gives_exact_counts_and_statuses(tmp_path):
  """A model whose logits are all 0 decodes token 0 greedily, every step: with token 0 as
  the turn stop each turn is one token, so the script alone decides the episode."""
  ctx = _ctx(tmp_path)
  model = Decoder(tiny_config(vocab_size=ctx.tokenizer.vocab_size), rngs=nnx.Rngs(0))
  model.final_norm.scale[...] = jnp.zeros_like(model.final_norm.scale[...])
  spec = TurnSpec(total=12, stop_tokens=(ctx.tokenizer.eos_id,), turn_stops=((0,),),
                  greedy=True, top_k=0, use_top_p=False, use_min_p=False, pad_id=0,
                  scratch=65)
  prompts = _prompts(ctx, 6)
  rows, eps = run_episodes(ctx, model, prompts, jax.random.key(0), env_factory=ScriptedEnv,
                           spec=spec, episode=_episode(3, 64, 0.5))
  got = [(e.status, e.turns, e.tool_calls, e.tool_failures) for e in eps]
  assert got == [("done", 3, 2, 1), ("env_error", 2, 2, 1), ("max_turns", 3, 3, 0),
                 ("env_timeout", 1, 1, 1), ("length", 1, 1, 0), ("env_error", 0, 0, 0)]
  tok = ctx.tokenizer
  # episode 0: [turn stop | "12" | turn stop | "x" | turn stop]: observations carry no mask
  np.testing.assert_array_equal(rows["tokens"][0, :5], [0, *tok.encode("12"), 0, *tok.encode("x")][:5])
  np.testing.assert_array_equal(rows["mask"][0, :7], [1, 0, 0, 1, 0, 1, 0])
  assert rows["extent"][0] == 6
  assert (rows["sampler_logp"][rows["mask"] == 0] == 0).all()
  # episode 4: the 26-token observation is cut to the 10 tokens the budget leaves
  assert rows["extent"][4] == 12 and rows["mask"][4].sum() == 2
  m = episode_metrics(eps, float(rows["mask"].sum()), float(rows["extent"].sum()), 0.0)
  assert m["termination/done"] == pytest.approx(1 / 6)
  assert m["termination/env_error"] == pytest.approx(2 / 6)
  assert m["tools/calls_per_episode"] == pytest.approx((2 + 2 + 3 + 1 + 1) / 6)
  assert m["tools/failure_rate"] == pytest.approx(3 / 9)
  assert m["turns/max"] == 3


class EchoEnv:
  """Answers every turn with a few random characters; ends after 3 turns."""

  def __init__(self, prompt):
    self.rng = np.random.default_rng(int(prompt.id))

  def reset(self, prompt):
    return "go:"

  def step(self, action):
    text = "".join(self.rng.choice(list("abcdef"), self.rng.integers(1, 5)))
    return Step(observation=text)


def test_trainer_log_probs_equal_the_samplers_on_every_sampled_token(tmp_path):
  ctx = _ctx(tmp_path)
  model = perturb_params(Decoder(tiny_config(vocab_size=ctx.tokenizer.vocab_size),
                                 rngs=nnx.Rngs(0)), scale=0.3)
  tok = ctx.tokenizer
  stops = tuple((tok.encode(c)[0],) for c in "0123456789")   # digits end a turn
  spec = TurnSpec(total=40, stop_tokens=(tok.eos_id,), turn_stops=stops, greedy=False,
                  top_k=0, use_top_p=False, use_min_p=False, pad_id=0, scratch=9)
  prompts = _prompts(ctx, 8)
  rows, eps = run_episodes(ctx, model, prompts, jax.random.key(1), env_factory=EchoEnv,
                           spec=spec, episode=_episode(4, 8, None))
  assert max(e.turns for e in eps) >= 2
  observation = (np.arange(40)[None] < rows["extent"][:, None]) & (rows["mask"] == 0)
  assert observation.sum() > 10                      # reset and turn observations are there
  batch = {k: jnp.asarray(rows[k]) for k in ("prompt_tokens", "prompt_mask", "tokens", "mask")}
  logp, _ = objective.policy_forward(model, batch, temperature=1.0)
  sampled = rows["mask"] > 0
  # the sampler's cached decode vs the trainer's full forward: other matmul/attention sums
  assert_close_f32(np.asarray(logp)[sampled], rows["sampler_logp"][sampled], ulps=256)
  # decoding the sampled tokens never shows observation text (mask/observation disjoint)
  for i in range(8):
    sampled_text = tok.decode(rows["tokens"][i][sampled[i]].tolist())
    assert "go:" not in sampled_text


def test_extend_prefill_equals_a_fresh_prefill():
  model = perturb_params(Decoder(tiny_config(), rngs=nnx.Rngs(0)), scale=0.3)
  rng = np.random.default_rng(0)
  b, first, extra = 3, np.array([4, 6, 5]), 4
  total = 12
  seqs = rng.integers(3, 97, (b, total)).astype(np.int32)
  cache = model.init_cache(b, total)
  kv_first = (np.arange(total)[None] < first[:, None]).astype(np.int32)
  pos = np.broadcast_to(np.arange(total), (b, total))
  width = first.max()
  _, cache = model.forward_cached(jnp.asarray(seqs[:, :width]), positions=jnp.asarray(pos[:, :width]),
                                  cache=cache, start=0, kv_mask=jnp.asarray(kv_first))
  # extend each row from its own length, with per-row starts
  idx = first[:, None] + np.arange(extra)[None]
  chunk = np.take_along_axis(seqs, idx, 1)
  kv_ext = (np.arange(total)[None] < (first + extra)[:, None]).astype(np.int32)
  logits, _ = model.forward_cached(jnp.asarray(chunk), positions=jnp.asarray(idx), cache=cache,
                                   start=jnp.asarray(first), kv_mask=jnp.asarray(kv_ext))
  for r in range(b):
    n = first[r] + extra
    full = model(jnp.asarray(seqs[r:r + 1, :n]))
    # cached extend vs full forward: other attention and matmul sums (256 eps32 of the
    # largest logit, ~2e-4 here; extending one position late moves these logits by 1 to 4)
    assert_close_f32(logits[r], full[0, first[r]:n], ulps=256)


def test_statuses_decide_loss_and_baseline(tmp_path):
  config = micro_config("calculator", tmp_path, **{
      "algo.on_truncated_episode.length": "drop", "algo.on_truncated_episode.max_turns": "mask"})
  # done, max_turns, length, env_error, timeout
  records = EpisodeRecords(status=np.asarray([0, 1, 2, 3, 4]), tool_calls=np.zeros(5),
                           episodes=[], metrics={})
  keep, valid = records.loss_rows(tuple(config.algo.on_truncated_episode.items()))
  np.testing.assert_array_equal(keep, [1, 0, 0, 0, 0])
  np.testing.assert_array_equal(valid, [1, 1, 0, 1, 1])


CALC = {"run.iterations": 2, "sampling.max_new_tokens": 24, "run.save_every": 1,
        "task.reward_fns": ["tests/signal_rewards.py:digit_share"], "task.reward_fns_mode": "add"}


def _drop(records):
  return [{k: v for k, v in r.items() if not k.startswith("time/") and k != "compile/programs"
           and k != "env/seconds"} for r in records]


def test_calculator_trains_resumes_exactly_and_matches_on_eight_devices(tmp_path):
  runs = {}
  for name, extra in (("one", {"parallel.num_devices": 1}), ("eight", {})):
    config = micro_config("calculator", tmp_path / name, **{**CALC, **extra})
    result = train(config)
    runs[name] = read_records(tmp_path / name / "calculator")
    assert "heldout_tool_use" in result
  one, eight = runs["one"], runs["eight"]
  assert {"turns/mean", "tools/calls_per_episode", "termination/done",
          "mismatch/turn0_logp_gap"} <= set(one[0])
  assert one[0]["update/grad_norm"] > 0
  for a, b in zip(one, eight):
    assert a["train/raw_score"] == b["train/raw_score"]
    # 1 vs 8 devices: other reduction orders; a loss near 0 keeps its O(1) terms' rounding
    np.testing.assert_allclose(b["update/loss"], a["update/loss"], rtol=5e-5,
                               atol=f32_atol(1.0, ulps=64))
  split = micro_config("calculator", tmp_path / "split", **CALC)
  train(split, stop_after=1)
  train(split)
  assert _drop(read_records(tmp_path / "split" / "calculator")) == _drop(eight)
  json.dumps(one)   # metrics are JSON-able


def test_turn_rewards_give_each_turn_its_discounted_return():
  # two episodes of one group: turns end at completion columns 2 and 4 (then one more turn)
  eps = [Episode(step_rewards=[0.0, 1.0], turn_ends=[2, 4]),
         Episode(step_rewards=[0.5], turn_ends=[3])]
  mask = np.array([[1, 1, 0, 1, 0, 0], [1, 1, 1, 0, 1, 1]])   # 0 at observation tokens
  scores = np.array([1.0 + 0.0, 0.5 + 2.0])   # env rewards + a verifier part (0, then 2)
  env = np.array([1.0, 0.5])
  rewards, exists, token_turn = turn_inputs(eps, mask)
  adv = turn_advantages(jnp.asarray(rewards), jnp.asarray(exists), jnp.asarray(token_turn),
                        jnp.asarray(scores - env, jnp.float32), jnp.asarray(mask), gamma=0.5,
                        group_size=2)
  # episode 0: G = [0 + 0.5 * 1, 1] ; episode 1: turns [0.5, 0 + 2 (verifier, last turn)]
  # -> G = [0.5 + 0.5 * 2, 2]; baseline over G_0 = (0.5, 1.5): mean 1, std 0.7071
  g = np.array([[0.5, 0.5, 0, 1.0, 0, 0], [1.5, 1.5, 1.5, 0, 2.0, 2.0]])
  want = np.where(mask > 0, (g - 1.0) / (np.sqrt(0.5) + 1e-6), 0.0)
  np.testing.assert_allclose(adv, want, rtol=1e-6)


def test_max_total_tokens_is_the_episode_budget_and_needs_an_env():
  from rljax.train.config import ConfigError, completion_columns, load_config
  config = load_config("experiments/calculator.py", {"sampling.max_total_tokens": 56})
  assert completion_columns(config) == 56   # the rows' completion columns
  assert config.sampling.max_new_tokens == 40   # derived, never written back
  with pytest.raises(ConfigError, match="sampling.max_total_tokens"):
    load_config("experiments/grpo.py", {"sampling.max_total_tokens": 56})
