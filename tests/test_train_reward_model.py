"""A learned reward model in the trainer: as a reward term and as the PPO critic's start."""

import numpy as np
from flax import nnx
from train_micro import micro_config, read_records

from rljax.data import CharTokenizer, make_task
from rljax.models import RewardModel
from rljax.models.testing import tiny_config
from rljax.rewards import preferences, reward_model
from rljax.train.loop import train
from rljax.train.reward_model import train_reward_model


def _trained_reward_model(path):
  tok = CharTokenizer()
  task = make_task("arithmetic", difficulty=(1, 3), seed=0, n_heldout=8)
  data = preferences.make_preference_data(task, tok, n_prompts=32, k=3, seed=0)
  model = RewardModel(tiny_config(vocab_size=tok.vocab_size), rngs=nnx.Rngs(0))
  batches = reward_model.preference_batches(data.train, batch_size=8)
  model, _ = train_reward_model(model, batches, steps=5, lr=3e-3)
  reward_model.save_reward_model(model, str(path), tokenizer=tok)
  return str(path)


def test_reward_model_as_reward_and_as_critic_init(tmp_path):
  path = _trained_reward_model(tmp_path / "rm")
  config = micro_config("grpo", tmp_path, **{"task.reward_model_path": path,
                                             "task.reward_model_weight": 0.5,
                                             "run.iterations": 1})
  train(config)
  record = read_records(tmp_path / "grpo")[0]
  verifier_only = record["train/accuracy"] + 0.1 * record["train/format"]
  assert not np.isclose(record["train/raw_score"], verifier_only)   # the RM term is in

  config = micro_config("ppo", tmp_path, **{"algo.critic_init_path": path,
                                            "run.iterations": 1, "model.hidden_size": 64,
                                            "model.num_heads": 4, "model.num_kv_heads": 2})
  train(config)
  record = read_records(tmp_path / "ppo")[0]
  assert np.isfinite(record["update/value_loss"])
