"""`rljax reward-model --data prefs.jsonl --model-dir HF_DIR --out OUT [options]`.

Trains a reward model on preference data (RLHF's middle step: SFT -> reward model -> PPO;
Ouyang et al. 2022, arXiv:2203.02155, Sec. 3.5) and writes it where
`--config.task.reward_model_path=OUT` (a reward term) or `--config.algo.critic_init_path=OUT`
(the PPO critic's start) reads it.

  --data FILE       JSONL rows {"prompt", "chosen", "rejected"} or {"prompt",
                    "completions": [...], "ranks": [...]} (0 = best; a tie is not trained on)
  --model-dir DIR   a Hugging Face causal-LM directory (config.json, *.safetensors, tokenizer):
                    the tokenizer, and the trunk the reward model starts from (new scalar head)
  --out DIR         where `save_reward_model` writes the model (and the tokenizer's files)
  --steps N (200)  --lr X (1e-5)  --batch-size N (8 prompts)  --warmup-steps N (0)
  --weight-decay X (0)  --grad-clip X (1)  --heldout X (0.1: fraction of prompts held out)
  --max-len N (the model's)  --seed N (0)  --log-every N (0: quiet)

Prints the held-out pairwise accuracy (the fraction of held-out (better, worse) pairs the
model orders correctly; 0.5 is chance). Exit status 2 on bad input, naming the flag, or the
line and field of the data file.
"""

from __future__ import annotations

import numpy as np

from rljax.cli.overrides import UsageError
from rljax.data.tokenizers import HFTokenizer
from rljax.rewards.preferences import encode_preferences, read_preference_jsonl
from rljax.rewards.reward_model import pairwise_accuracy, preference_batches, save_reward_model
from rljax.train.reward_model import reward_model_from_hf, train_reward_model

OPTIONS = {"data": str, "model-dir": str, "out": str, "steps": int, "lr": float,
           "batch-size": int, "warmup-steps": int, "weight-decay": float, "grad-clip": float,
           "heldout": float, "max-len": int, "seed": int, "log-every": int}
DEFAULTS = {"steps": 200, "lr": 1e-5, "batch-size": 8, "warmup-steps": 0, "weight-decay": 0.0,
            "grad-clip": 1.0, "heldout": 0.1, "max-len": 0, "seed": 0, "log-every": 0}


def parse_reward_model_args(argv) -> dict:
  """{option name with '_' for '-': value} of `rljax reward-model ARGV`, or a UsageError."""
  options, args = dict(DEFAULTS), list(argv)
  while args:
    name, eq, value = args.pop(0).partition("=")
    key = name.removeprefix("--")
    if not name.startswith("--") or key not in OPTIONS:
      raise UsageError(f"unknown argument {name!r}; options: "
                       + " ".join(f"--{k}" for k in OPTIONS))
    if not eq:
      if not args:
        raise UsageError(f"{name} needs a value")
      value = args.pop(0)
    try:
      options[key] = OPTIONS[key](value)
    except ValueError as e:
      raise UsageError(f"{name} takes a {OPTIONS[key].__name__}, got {value!r}") from e
  missing = [f"--{k}" for k in ("data", "model-dir", "out") if k not in options]
  if missing:
    raise UsageError(f"{', '.join(missing)} required (rljax reward-model --data prefs.jsonl "
                     "--model-dir HF_DIR --out OUT)")
  for key in ("steps", "batch-size"):
    if options[key] < 1:
      raise UsageError(f"--{key} must be >= 1, got {options[key]}")
  if not 0.0 < options["heldout"] < 1.0:
    raise UsageError(f"--heldout is a fraction of the prompts in (0, 1), got {options['heldout']}")
  return {k.replace("-", "_"): v for k, v in options.items()}


def split_heldout(examples, fraction: float, seed: int):
  """(train, held-out) examples: a seeded shuffle, at least one prompt on each side."""
  if len(examples) < 2:
    raise ValueError(f"the data has {len(examples)} prompt(s); need >= 2 (train and held out)")
  order = np.random.default_rng(seed).permutation(len(examples))
  n_held = min(max(1, round(fraction * len(examples))), len(examples) - 1)
  return [examples[i] for i in order[n_held:]], [examples[i] for i in order[:n_held]]


def read_inputs(o: dict):
  """(examples, tokenizer, initial reward model) named by the options; a UsageError naming the
  file (and the line and field of a bad data row) when one cannot be read."""
  try:
    examples = read_preference_jsonl(o["data"])
    tokenizer = HFTokenizer(o["model_dir"])
    model = reward_model_from_hf(o["model_dir"], seed=o["seed"])
  except (ValueError, OSError) as e:
    raise UsageError(str(e)) from e
  return examples, tokenizer, model


def train_from_files(o: dict) -> dict:
  """Reads, tokenizes, trains, evaluates and saves as the command does (`o`: parsed options).

  Returns:
    {"heldout_accuracy", "train_accuracy", "heldout_pairs", "history", "out"}.
  """
  examples, tokenizer, model = read_inputs(o)
  max_len = o["max_len"] or model.cfg.max_position_embeddings
  try:
    train_rows, held_rows = split_heldout(examples, o["heldout"], o["seed"])
  except ValueError as e:
    raise UsageError(f"{o['data']}: {e}") from e
  k = max(len(e.completions) for e in examples)
  train, held = (encode_preferences(rows, tokenizer, k=k, max_len=max_len)
                 for rows in (train_rows, held_rows))
  batch_size = min(o["batch_size"], len(train_rows))
  model, history = train_reward_model(
      model, preference_batches(train, batch_size=batch_size, seed=o["seed"]),
      steps=o["steps"], lr=o["lr"], weight_decay=o["weight_decay"],
      warmup_steps=o["warmup_steps"], grad_clip=o["grad_clip"], log_every=o["log_every"])
  save_reward_model(model, o["out"])
  tokenizer.hf.save_pretrained(o["out"])   # RewardModelScorer.from_checkpoint(OUT) finds it
  ranks, mask = held["ranks"], held["mask"] > 0
  pairs = sum(int(((ranks[b][:, None] < ranks[b][None, :]) & mask[b][:, None]
                   & mask[b][None, :]).sum()) for b in range(len(held_rows)))
  return {"heldout_accuracy": pairwise_accuracy(model, held),
          "train_accuracy": pairwise_accuracy(model, train), "heldout_pairs": pairs,
          "history": history, "out": o["out"]}


def reward_model_command(argv) -> dict:
  """`rljax reward-model ARGV`: trains, saves, prints the held-out pairwise accuracy; returns
  `train_from_files`' result. Bad flags or data: a UsageError (exit status 2)."""
  result = train_from_files(parse_reward_model_args(argv))
  print(f"rljax reward-model: held-out pairwise accuracy {result['heldout_accuracy']:.3f} "
        f"over {result['heldout_pairs']} pairs (chance 0.5; train "
        f"{result['train_accuracy']:.3f}, {len(result['history'])} steps); saved to "
        f"{result['out']} (use --config.task.reward_model_path={result['out']})")
  return result
