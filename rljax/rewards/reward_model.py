"""Learned reward models: the preference loss and batches, pairwise accuracy, checkpoints, and a
scorer with the reward-function protocol. The ranking losses are in `rljax.rewards.ranking`
(re-exported here), the trainer in `rljax.train.reward_model` (`rljax reward-model`), preference
data (a JSONL file, or a generated set for the synthetic task) in `rljax.rewards.preferences`.

Sequence layout (training, scoring and the critic initialised from the model all agree):
`[bos] + prompt + completion + [eos]`, right-padded; the reward is the scalar head at the
last real token, the EOS (Ouyang et al. 2022, arXiv:2203.02155, Sec. 3.5).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rljax.data.batching import DEFAULT_BUCKETS, bucket_length
from rljax.data.tokenizers import CharTokenizer, HFTokenizer
from rljax.models.config import ModelConfig
from rljax.models.decoder import positions_from_mask
from rljax.models.heads import RewardModel, last_token_index
from rljax.models.hf import load_hf_reward
from rljax.models.stack import restore_in_layout
from rljax.rewards.ranking import (
  BradleyTerryDiagnostics,
  KwiseDiagnostics,
  bradley_terry_loss,
  kwise_pairs,
  kwise_ranking_loss,
)

# ------------------------------------------------------------------- encoding, forward


def encode_sequence(tokenizer, prompt_text: str, completion: str, *, max_len: int | None = None):
  """`[bos] + prompt + completion + [eos]` ids; longer than `max_len`: prompt cut on the left."""
  bos = [tokenizer.bos_id] if tokenizer.bos_id is not None else []
  head = bos + tokenizer.encode(prompt_text)
  tail = tokenizer.encode(completion) + [tokenizer.eos_id]
  ids = head + tail
  return ids if max_len is None else ids[-max_len:]


def _row_scores(model: RewardModel, tokens_ns, attention_ns):
  """Score at the last real token of each row [N]; an all-padding row scores one dummy token."""
  empty = attention_ns.sum(axis=1) == 0
  attention = jnp.where(empty[:, None], jnp.zeros_like(attention_ns).at[:, 0].set(1),
                        attention_ns)
  positions = positions_from_mask(attention)
  return model.score(tokens_ns, positions, attention, last_token_index(attention))


def preference_scores(model: RewardModel, batch) -> jax.Array:
  """r(x_b, y_bk) for a preference batch: flattens B·K rows for one forward, float32 [B,K]."""
  b, k, s = batch["tokens"].shape
  attention = batch["attention_mask"] * (batch["mask"][..., None] > 0)
  scores = _row_scores(model, batch["tokens"].reshape(b * k, s), attention.reshape(b * k, s))
  return scores.reshape(b, k)


def preference_loss(model: RewardModel, batch) -> tuple[jax.Array, jax.Array]:
  """(K-wise loss averaged over the batch's prompts that have a pair, pairwise accuracy over
  all the batch's valid pairs): the objective of `rljax.train.reward_model`."""
  scores = preference_scores(model, batch)
  loss_b, diag = kwise_ranking_loss(scores, batch["ranks"], batch["mask"])
  has = (diag.num_pairs_b > 0).astype(jnp.float32)
  loss = loss_b.sum() / jnp.maximum(has.sum(), 1.0)  # mean over prompts (one element each)
  acc = (diag.accuracy_b * diag.num_pairs_b).sum() / jnp.maximum(diag.num_pairs_b.sum(), 1.0)
  return loss, acc


# --------------------------------------------------------------------- batches, accuracy


def preference_batches(data: dict, *, batch_size: int, seed: int = 0) -> Iterator[dict]:
  """Endless shuffled batches of whole prompts (all K completions of a prompt together)."""
  n = data["tokens"].shape[0]
  if batch_size > n:
    raise ValueError(f"preference_batches: batch_size={batch_size} > {n} prompts")
  rng = np.random.default_rng(seed)
  while True:
    order = rng.permutation(n)
    for i in range(0, n - batch_size + 1, batch_size):
      idx = order[i:i + batch_size]
      yield {key: v[idx] for key, v in data.items()}


@jax.jit(static_argnums=0)
def _eval_scores(graphdef, state, batch):
  return preference_scores(nnx.merge(graphdef, state), batch)


def pairwise_accuracy(model: RewardModel, data: dict, *, batch_size: int = 64) -> float:
  """Fraction of all valid (winner, loser) pairs in `data` with r(winner) > r(loser)."""
  graphdef, state = nnx.split(model)
  correct = total = 0.0
  n = data["tokens"].shape[0]
  for i in range(0, n, batch_size):
    chunk = {k: _pad_rows(v[i:i + batch_size], batch_size) for k, v in data.items()}
    scores = _eval_scores(graphdef, state, chunk)
    _, diag = kwise_ranking_loss(scores, jnp.asarray(chunk["ranks"]), jnp.asarray(chunk["mask"]))
    correct += float((diag.accuracy_b * diag.num_pairs_b).sum())
    total += float(diag.num_pairs_b.sum())
  return correct / max(total, 1.0)


def _pad_rows(x, rows):
  """Zero rows appended up to `rows` (padded prompts have mask 0: no pairs, one shape)."""
  x = np.asarray(x)
  if x.shape[0] == rows:
    return x
  return np.concatenate([x, np.zeros((rows - x.shape[0],) + x.shape[1:], x.dtype)])


_CONFIG_FILE = "reward_model_config.json"


def save_reward_model(model: RewardModel, path: str, *, tokenizer=None) -> None:
  """Writes `path/reward_model_config.json` + orbax `path/params` (+ the CharTokenizer)."""
  import orbax.checkpoint as ocp

  path = os.path.abspath(path)
  os.makedirs(path, exist_ok=True)
  with open(os.path.join(path, _CONFIG_FILE), "w") as f:
    json.dump(dataclasses.asdict(model.cfg), f, indent=1)
  with ocp.StandardCheckpointer() as ckpt:
    ckpt.save(os.path.join(path, "params"), nnx.state(model, nnx.Param), force=True)
  if tokenizer is not None and hasattr(tokenizer, "save"):
    tokenizer.save(path)


def load_reward_model(path: str) -> RewardModel:
  """A `RewardModel` from `save_reward_model`'s directory, or from a Hugging Face
  *ForSequenceClassification directory (`rljax.models.load_hf_reward`)."""
  import orbax.checkpoint as ocp

  path = os.path.abspath(path)
  if not os.path.exists(os.path.join(path, _CONFIG_FILE)):
    if os.path.exists(os.path.join(path, "config.json")):
      return load_hf_reward(path)[0]
    raise FileNotFoundError(f"load_reward_model: {path!r} holds neither {_CONFIG_FILE} "
                            "(save_reward_model) nor config.json (Hugging Face)")
  with open(os.path.join(path, _CONFIG_FILE)) as f:
    cfg = ModelConfig(**json.load(f))
  model = nnx.eval_shape(lambda: RewardModel(cfg, rngs=nnx.Rngs(0)))
  target = jax.tree.map(ocp.utils.to_shape_dtype_struct, nnx.state(model, nnx.Param))
  params = os.path.join(path, "params")
  with ocp.StandardCheckpointer() as ckpt:   # saved scanned or per layer: either loads
    nnx.update(model, restore_in_layout(lambda t: ckpt.restore(params, t),
                                        ckpt.metadata(params).item_metadata, target))
  return model


@jax.jit(static_argnums=0)
def _score_rows(graphdef, state, tokens_ns, attention_ns):
  return _row_scores(nnx.merge(graphdef, state), tokens_ns, attention_ns)


class RewardModelScorer:
  """A trained `RewardModel` as a reward function `fn(prompt, completion) -> float`.

  Scores `[bos] + prompt + completion + [eos]` at the EOS (InstructGPT,
  arXiv:2203.02155, Sec. 3.5). Usable as a term of `rljax.rewards.compose`.

  Args:
    model: the reward model (its parameters are read once, at construction).
    tokenizer: the tokenizer it was trained with.
    batch_size: rows per forward; smaller batches are padded to a power of two.
    max_len: longest sequence (default: the model's max_position_embeddings); longer
      ones keep their last `max_len` tokens (the prompt is cut on the left).
    buckets: allowed padded lengths, so jit compiles one program per (rows, bucket).
  Note: completions are texts without EOS (as decoded by the trainer); EOS is always
  appended, also to truncated completions, so the score is read at the same token.
  """

  def __init__(self, model: RewardModel, tokenizer, *, batch_size: int = 32,
               max_len: int | None = None, buckets: Sequence[int] = DEFAULT_BUCKETS):
    self.tokenizer, self.batch_size = tokenizer, int(batch_size)
    self.max_len = int(max_len or model.cfg.max_position_embeddings)
    self.buckets = tuple(b for b in sorted(buckets) if b < self.max_len) + (self.max_len,)
    self._graphdef, self._state = nnx.split(model)

  @classmethod
  def from_checkpoint(cls, path: str, tokenizer=None, **kwargs) -> RewardModelScorer:
    """From `save_reward_model`'s (or a HF reward model's) directory; the tokenizer defaults
    to the CharTokenizer saved there, else a Hugging Face tokenizer in `path`."""
    if tokenizer is None:
      char = os.path.join(path, "char_tokenizer.json")
      tokenizer = CharTokenizer.load(char) if os.path.exists(char) else HFTokenizer(path)
    return cls(load_reward_model(path), tokenizer, **kwargs)

  def __call__(self, prompt: Any, completion: str) -> float:
    return float(self.score_batch([prompt], [completion])[0])

  def warmup(self, max_tokens: int, *, rows: Sequence[int] = (1,)) -> None:
    """Compiles every (rows, length bucket <= bucket(max_tokens)) program now, so that a
    reward deadline (e.g. `compose(timeout=...)`) never includes compilation."""
    top = bucket_length(min(max_tokens, self.max_len), self.buckets)
    for r in rows:
      for s in (b for b in self.buckets if b <= top):
        zeros = np.zeros((r, s), np.int32)
        _score_rows(self._graphdef, self._state, zeros, zeros).block_until_ready()

  def score_batch(self, prompts: Sequence[Any], completions: Sequence[str]) -> np.ndarray:
    """r(x_i, y_i) for B pairs (prompts: `Prompt`s or texts) -> float32 [B]."""
    if len(prompts) != len(completions):
      raise ValueError(f"score_batch: {len(prompts)} prompts vs {len(completions)} completions")
    ids = [encode_sequence(self.tokenizer, getattr(p, "text", p), c, max_len=self.max_len)
           for p, c in zip(prompts, completions)]
    out = []
    for i in range(0, len(ids), self.batch_size):
      chunk = ids[i:i + self.batch_size]
      rows = min(self.batch_size, 1 << (len(chunk) - 1).bit_length())
      s = bucket_length(max(map(len, chunk)), self.buckets)
      tokens = np.full((rows, s), self.tokenizer.pad_id, np.int32)
      attention = np.zeros((rows, s), np.int32)
      for j, row in enumerate(chunk):
        tokens[j, :len(row)], attention[j, :len(row)] = row, 1
      scores = _score_rows(self._graphdef, self._state, tokens, attention)
      out.append(np.asarray(scores, np.float32)[:len(chunk)])
    return np.concatenate(out) if out else np.zeros(0, np.float32)


__all__ = ["BradleyTerryDiagnostics", "KwiseDiagnostics", "RewardModelScorer",
           "bradley_terry_loss", "encode_sequence", "kwise_pairs", "kwise_ranking_loss",
           "load_reward_model", "pairwise_accuracy", "preference_batches", "preference_loss",
           "preference_scores", "save_reward_model"]
