"""Learned reward models: Bradley-Terry and K-wise ranking losses, a small trainer,
checkpoints, and a scorer with the reward-function protocol (the generated preference set
for the synthetic task is in `rljax.rewards.preferences`).

Sequence layout (training, scoring and the critic initialised from the model all agree):
`[bos] + prompt + completion + [eos]`, right-padded; the reward is the scalar head at the
last real token, the EOS (Ouyang et al. 2022, arXiv:2203.02155, Sec. 3.5).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from rljax.data.batching import DEFAULT_BUCKETS, bucket_length
from rljax.data.tokenizers import CharTokenizer, HFTokenizer
from rljax.models.config import ModelConfig
from rljax.models.decoder import positions_from_mask
from rljax.models.heads import RewardModel, last_token_index
from rljax.models.hf import load_hf_reward
from rljax.models.stack import restore_in_layout

# ------------------------------------------------------------------------------- losses


class BradleyTerryDiagnostics(NamedTuple):
  """accuracy_b: 1.0 where r_w > r_l (ties count 0), float32 [B]; margin_b: r_w - r_l [B]."""
  accuracy_b: jax.Array
  margin_b: jax.Array


def bradley_terry_loss(chosen_scores_b, rejected_scores_b, *, margin=None):
  """Pairwise Bradley-Terry loss, −log σ(r(x, y_w) − r(x, y_l) − m).

  Bradley & Terry 1952, "Rank analysis of incomplete block designs"; Ouyang et al. 2022,
  "Training language models to follow instructions with human feedback", arXiv:2203.02155,
  Eq. 1 (one pair); margin m as in Touvron et al. 2023, "Llama 2", arXiv:2307.09288, Eq. 2.

  Args:
    chosen_scores_b: r(x, y_w), float [B].
    rejected_scores_b: r(x, y_l), float [B].
    margin: None (Eq. 1), a scalar or float [B] (Llama 2's m(r), larger for clearer pairs).
  Returns:
    (per-pair loss float32 [B], `BradleyTerryDiagnostics`).
  Note: computed as −log_sigmoid(·) (never log(sigmoid(·))), finite for any score gap.
  """
  chex.assert_rank(chosen_scores_b, 1)
  chex.assert_equal_shape([chosen_scores_b, rejected_scores_b])
  diff = chosen_scores_b.astype(jnp.float32) - rejected_scores_b.astype(jnp.float32)
  shifted = diff if margin is None else diff - jnp.asarray(margin, jnp.float32)
  loss = -jax.nn.log_sigmoid(shifted)
  return loss, BradleyTerryDiagnostics((diff > 0).astype(jnp.float32), diff)


def kwise_pairs(k: int) -> tuple[np.ndarray, np.ndarray]:
  """All C(K, 2) slot pairs (first, second), first < second, as static int32 arrays [C].

  When the K completions are sorted best first (rank = slot), `first` is the winner and
  `second` the loser of every pair.
  """
  if k < 2:
    raise ValueError(f"kwise_pairs: need k >= 2, got {k}")
  first, second = np.triu_indices(k, 1)
  return first.astype(np.int32), second.astype(np.int32)


class KwiseDiagnostics(NamedTuple):
  """accuracy_b: fraction of the prompt's valid pairs ordered correctly, float32 [B];
  num_pairs_b: number of valid pairs, float32 [B] (0 for a prompt without any)."""
  accuracy_b: jax.Array
  num_pairs_b: jax.Array


def kwise_ranking_loss(scores_bk, ranks_bk, mask_bk):
  """InstructGPT K-wise ranking loss, one batch element per prompt.

  loss(x) = −1/C(K,2) · Σ_{(y_w, y_l)} log σ(r(x, y_w) − r(x, y_l)) over all pairs of the
  prompt's ranking (Ouyang et al. 2022, arXiv:2203.02155, Eq. 1).

  Args:
    scores_bk: r(x_b, y_bk), float [B,K].
    ranks_bk: int [B,K], 0 = best; equal ranks are a tie.
    mask_bk: [B,K], 1 = the completion exists (prompts may have fewer than K).
  Returns:
    (per-prompt loss float32 [B], `KwiseDiagnostics`).
  Note: C(K,2) is replaced by the number of valid pairs of the prompt (both completions
  present, ranks differ): ties and missing completions are dropped, not counted as 0.
  A prompt with no valid pair has loss 0 and num_pairs 0.
  """
  chex.assert_rank(scores_bk, 2)
  chex.assert_equal_shape([scores_bk, ranks_bk, mask_bk])
  first, second = kwise_pairs(scores_bk.shape[1])
  s = scores_bk.astype(jnp.float32)
  r = ranks_bk
  m = mask_bk > 0
  first_wins = r[:, first] < r[:, second]  # [B,C]
  valid = m[:, first] & m[:, second] & (r[:, first] != r[:, second])
  s_w = jnp.where(valid, jnp.where(first_wins, s[:, first], s[:, second]), 0.0)
  s_l = jnp.where(valid, jnp.where(first_wins, s[:, second], s[:, first]), 0.0)
  pair_loss, diag = bradley_terry_loss(s_w.reshape(-1), s_l.reshape(-1))  # masked: 0, no grad
  n = valid.sum(axis=1).astype(jnp.float32)
  denom = jnp.maximum(n, 1.0)
  loss_b = jnp.where(valid, pair_loss.reshape(valid.shape), 0.0).sum(axis=1) / denom
  acc_b = jnp.where(valid, diag.accuracy_b.reshape(valid.shape), 0.0).sum(axis=1) / denom
  return loss_b, KwiseDiagnostics(acc_b, n)


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


def _batch_loss(model, batch):
  scores = preference_scores(model, batch)
  loss_b, diag = kwise_ranking_loss(scores, batch["ranks"], batch["mask"])
  has = (diag.num_pairs_b > 0).astype(jnp.float32)
  loss = loss_b.sum() / jnp.maximum(has.sum(), 1.0)  # mean over prompts (one element each)
  acc = (diag.accuracy_b * diag.num_pairs_b).sum() / jnp.maximum(diag.num_pairs_b.sum(), 1.0)
  return loss, acc


# ---------------------------------------------------------------------------- trainer


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


def train_reward_model(model: RewardModel, batches: Iterable[dict], *, steps: int, lr: float,
                       weight_decay: float = 0.0, warmup_steps: int = 0, grad_clip: float = 1.0,
                       log_every: int = 0) -> tuple[RewardModel, list[dict]]:
  """AdamW on the K-wise ranking loss (InstructGPT, arXiv:2203.02155, Sec. 3.5).

  Args:
    model: a `RewardModel`, updated in place.
    batches: iterable of dicts {tokens [B,K,S], attention_mask [B,K,S], ranks [B,K],
      mask [B,K]} (e.g. `preference_batches`); a list is cycled.
    steps: optimizer steps.
    lr: peak learning rate (linear warm-up over `warmup_steps`, then constant).
    weight_decay, grad_clip: AdamW decay; global-norm clip (0: off).
    log_every: print loss/accuracy every this many steps (0: silent).
  Returns:
    (model, history: one {"step", "loss", "accuracy"} per step, training-batch pair accuracy).
  """
  schedule = optax.join_schedules(
      [optax.linear_schedule(0.0, lr, max(warmup_steps, 1)), optax.constant_schedule(lr)],
      [max(warmup_steps, 1)])
  tx = optax.chain(*([optax.clip_by_global_norm(grad_clip)] if grad_clip > 0 else []),
                   optax.adamw(schedule, weight_decay=weight_decay))
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)

  @jax.jit
  def step(params, opt_state, batch):
    def loss_fn(p):
      return _batch_loss(nnx.merge(graphdef, p, rest), batch)
    (loss, acc), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss, acc

  opt_state = tx.init(params)
  source = _cycle(batches) if isinstance(batches, Sequence) else iter(batches)
  history = []
  for i in range(steps):
    batch = {k: jnp.asarray(v) for k, v in next(source).items()}
    params, opt_state, loss, acc = step(params, opt_state, batch)
    history.append({"step": i + 1, "loss": float(loss), "accuracy": float(acc)})
    if log_every and (i + 1) % log_every == 0:
      print(f"reward model step {i + 1}: loss {float(loss):.4f} pair acc {float(acc):.3f}")
  nnx.update(model, params)
  return model, history


def _cycle(items):
  while True:
    yield from items


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
