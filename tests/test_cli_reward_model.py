"""`rljax reward-model`: preference JSONL + a Hugging Face checkpoint directory -> a reward model
that `task.reward_model_path` loads, trained to rank held-out pairs above chance."""

import json

import numpy as np
import pytest
from tiny_hf import save_tiny_qwen2

from rljax.cli import COMMANDS, UsageError
from rljax.cli.reward_model import parse_reward_model_args, reward_model_command, split_heldout
from rljax.data import make_task
from rljax.models import RewardModel
from rljax.rewards.preferences import read_preference_jsonl
from rljax.rewards.reward_model import RewardModelScorer, load_reward_model


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
  """A random 1-layer Qwen2 (transformers) and a byte-level BPE tokenizer trained on the task."""
  return save_tiny_qwen2(tmp_path_factory.mktemp("hf") / "tiny-qwen2")


def _rows(n, seed):
  """Arithmetic prompts: the correct demonstration is chosen over a truncated one (no answer
  tag); every fourth row is a K-wise ranking: correct > answer without its tag > truncated."""
  task = make_task("arithmetic", difficulty=(1, 3), seed=seed, n_train=n)
  rng = np.random.default_rng(seed)
  rows = []
  for i, p in enumerate(task.train_prompts()[:n]):
    demo = task.demonstration(p)
    steps = demo.rsplit("\n", 1)[0]
    truncated = steps[:int(rng.integers(1, max(2, len(steps))))]
    if i % 4 == 3:
      rows.append({"prompt": p.text, "completions": [truncated, demo, f"{steps}\n{p.answer}"],
                   "ranks": [2, 0, 1]})
    else:
      rows.append({"prompt": p.text, "chosen": demo, "rejected": truncated})
  return rows


@pytest.fixture(scope="module")
def trained(hf_dir, tmp_path_factory):
  tmp = tmp_path_factory.mktemp("rm")
  data = tmp / "prefs.jsonl"
  data.write_text("".join(json.dumps(r) + "\n" for r in _rows(96, 0)))
  out = str(tmp / "rm")
  result = COMMANDS["reward-model"]([
      "--data", str(data), "--model-dir", hf_dir, "--out", out, "--steps", "40",
      "--lr=3e-3", "--batch-size", "8", "--heldout", "0.25", "--warmup-steps", "5"])
  return data, out, result


def test_heldout_pairwise_accuracy_beats_chance(trained):
  _, _, result = trained
  print(f"\nheld-out pairwise accuracy {result['heldout_accuracy']:.3f} over "
        f"{result['heldout_pairs']} pairs, train {result['train_accuracy']:.3f}")
  assert result["heldout_pairs"] >= 24       # 24 held-out prompts, one pair or more each
  assert result["heldout_accuracy"] > 0.75     # chance 0.5
  losses = [h["loss"] for h in result["history"]]
  assert np.mean(losses[-5:]) < np.mean(losses[:5])


def test_saved_model_loads_and_ranks_heldout_chosen_above_rejected(trained):
  data, out, result = trained
  assert isinstance(load_reward_model(out), RewardModel)
  scorer = RewardModelScorer.from_checkpoint(out)   # the tokenizer saved beside the model
  _, held = split_heldout(read_preference_jsonl(str(data)), 0.25, 0)
  gaps, correct, pairs = [], 0, 0
  for e in held:
    s = scorer.score_batch([e.prompt] * len(e.completions), e.completions)
    for i in range(len(s)):
      for j in range(len(s)):
        if e.ranks[i] < e.ranks[j]:
          gaps.append(s[i] - s[j])
          correct, pairs = correct + int(s[i] > s[j]), pairs + 1
  assert pairs == result["heldout_pairs"]
  assert np.mean(gaps) > 0
  # the reloaded model orders the held-out pairs as the trained one did (same weights)
  assert abs(correct / pairs - result["heldout_accuracy"]) <= 1 / pairs + 1e-9


def test_bad_rows_name_the_line_and_field(hf_dir, tmp_path):
  data = tmp_path / "bad.jsonl"
  data.write_text(json.dumps({"prompt": "a", "chosen": "b", "rejected": "c"}) + "\n"
                  + json.dumps({"prompt": "a", "chosen": "b"}) + "\n")
  args = ["--data", str(data), "--model-dir", hf_dir, "--out", str(tmp_path / "o")]
  with pytest.raises(UsageError, match=r"line 2: field 'rejected'"):
    reward_model_command(args)
  data.write_text(json.dumps({"prompt": "a", "completions": ["x", "y"], "ranks": [0]}) + "\n")
  with pytest.raises(UsageError, match=r"line 1: field 'ranks'"):
    reward_model_command(args)
  data.write_text("{not json\n")
  with pytest.raises(UsageError, match=r"line 1: not JSON"):
    reward_model_command(args)


def test_bad_flags_name_the_flag():
  with pytest.raises(UsageError, match="--out required"):
    parse_reward_model_args(["--data", "x", "--model-dir", "y"])
  with pytest.raises(UsageError, match="--steps takes a int"):
    parse_reward_model_args(["--steps", "many"])
  with pytest.raises(UsageError, match="unknown argument '--epochs'"):
    parse_reward_model_args(["--epochs", "3"])
