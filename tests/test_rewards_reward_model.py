"""Reward models: Bradley-Terry / K-wise losses vs NumPy, generated preferences, training to
better-than-chance held-out pairwise accuracy, critic initialisation, scorer, checkpoints."""

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tolerances import assert_close_f32

from rljax.data import CharTokenizer, make_task, parse_answer_tag
from rljax.models import RewardModel, ValueModel, last_token_index, positions_from_mask
from rljax.models.testing import tiny_config
from rljax.rewards import compose
from rljax.rewards import preferences as prefs
from rljax.rewards import reward_model as rm
from rljax.train.reward_model import train_reward_model

# ----------------------------------------------------------------------------- losses


def test_bradley_terry_golden():
  chosen, rejected = jnp.array([2.0, 0.0, -1.0]), jnp.array([0.0, 0.0, 1.0])
  loss, diag = rm.bradley_terry_loss(chosen, rejected)
  # log(1 + e^-d) for d = 2, 0, -2
  np.testing.assert_allclose(loss, [0.126928, 0.693147, 2.126928], rtol=1e-5)
  np.testing.assert_array_equal(diag.accuracy_b, [1.0, 0.0, 0.0])
  np.testing.assert_array_equal(diag.margin_b, [2.0, 0.0, -2.0])
  with_margin, _ = rm.bradley_terry_loss(chosen, rejected, margin=1.0)  # Llama 2 Eq. 2
  np.testing.assert_allclose(with_margin, [0.313262, 1.313262, 3.048587], rtol=1e-5)
  per_pair, _ = rm.bradley_terry_loss(chosen, rejected, margin=jnp.array([0.0, 1.0, 0.0]))
  np.testing.assert_allclose(per_pair, [0.126928, 1.313262, 2.126928], rtol=1e-5)


def test_bradley_terry_is_stable_for_huge_gaps():
  loss, _ = rm.bradley_terry_loss(jnp.array([1e4, -1e4]), jnp.array([0.0, 0.0]))
  np.testing.assert_allclose(loss, [0.0, 1e4], rtol=1e-6)


def test_bradley_terry_gradient_pushes_chosen_up_rejected_down():
  chosen, rejected = jnp.array([0.5, -1.0]), jnp.array([0.0, 2.0])
  g_w, g_l = jax.grad(lambda w, r: rm.bradley_terry_loss(w, r)[0].sum(), argnums=(0, 1))(
      chosen, rejected)
  sig = 1.0 / (1.0 + np.exp(np.array([0.5, -3.0])))  # dL/dr_w = -σ(-(r_w - r_l))
  np.testing.assert_allclose(g_w, -sig, rtol=1e-6)
  np.testing.assert_allclose(g_l, sig, rtol=1e-6)


def test_kwise_pairs_are_all_pairs():
  first, second = rm.kwise_pairs(4)
  assert list(zip(first.tolist(), second.tolist())) == list(itertools.combinations(range(4), 2))
  for k in range(2, 9):
    assert len(rm.kwise_pairs(k)[0]) == math.comb(k, 2)
  with pytest.raises(ValueError):
    rm.kwise_pairs(1)


def _kwise_numpy(scores, ranks, mask):
  """Paper equation as a loop: mean over the prompt's valid (winner, loser) pairs."""
  losses, accs = [], []
  for s, r, m in zip(scores, ranks, mask):
    terms = [(np.logaddexp(0.0, -(s[w] - s[lo])), s[w] > s[lo])
             for w in range(len(s)) for lo in range(len(s))
             if m[w] and m[lo] and r[w] < r[lo]]
    losses.append(np.mean([t for t, _ in terms]) if terms else 0.0)
    accs.append(np.mean([a for _, a in terms]) if terms else 0.0)
  return np.array(losses), np.array(accs)


def test_kwise_loss_matches_numpy_loop_with_ties_and_masks():
  rng = np.random.default_rng(0)
  scores = rng.normal(size=(7, 5)).astype(np.float32) * 2
  ranks = rng.integers(0, 4, size=(7, 5))  # ties included
  mask = (rng.random((7, 5)) < 0.75).astype(np.int32)
  mask[0] = [1, 0, 0, 0, 0]  # a prompt without any pair
  loss, diag = rm.kwise_ranking_loss(jnp.array(scores), jnp.array(ranks), jnp.array(mask))
  ref_loss, ref_acc = _kwise_numpy(scores, ranks, mask)
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(diag.accuracy_b, ref_acc, rtol=1e-6)
  assert loss[0] == 0.0 and diag.num_pairs_b[0] == 0


def test_kwise_full_ranking_is_instructgpt_mean_over_c_k_2():
  scores = jnp.array([[1.0, 0.3, -0.2, 0.8]])
  loss, diag = rm.kwise_ranking_loss(scores, jnp.array([[0, 1, 2, 3]]), jnp.ones((1, 4)))
  pairs = [(w, lo) for w, lo in itertools.combinations(range(4), 2)]
  bt, _ = rm.bradley_terry_loss(scores[0, [w for w, _ in pairs]], scores[0, [lo for _, lo in pairs]])
  np.testing.assert_allclose(loss[0], bt.sum() / math.comb(4, 2), rtol=1e-6)
  assert diag.num_pairs_b[0] == 6 and diag.accuracy_b[0] == pytest.approx(4 / 6)
  perm = jnp.array([2, 0, 3, 1])  # slot order carries no information
  loss_p, _ = rm.kwise_ranking_loss(scores[:, perm], jnp.array([[0, 1, 2, 3]])[:, perm],
                                    jnp.ones((1, 4)))
  np.testing.assert_allclose(loss_p, loss, rtol=1e-6)


def test_kwise_masked_completions_do_not_contribute():
  scores = jnp.array([[0.5, -0.5, 0.1, 3.0]])
  ranks, mask = jnp.array([[0, 2, 1, 3]]), jnp.array([[1, 1, 1, 0]])
  f = lambda s: rm.kwise_ranking_loss(s, ranks, mask)[0].sum()
  far = scores.at[0, 3].set(1e6)
  assert f(scores) == f(far)
  g = jax.grad(f)(scores)
  assert g[0, 3] == 0.0
  assert g[0, 0] < 0 < g[0, 1]  # best pushed up, worst pushed down


# ------------------------------------------------------------------ preference data

TOK = CharTokenizer()


@pytest.fixture(scope="module")
def task():
  return make_task("arithmetic", difficulty=(1, 3), seed=0, n_heldout=64)


@pytest.fixture(scope="module")
def data(task):
  return prefs.make_preference_data(task, TOK, n_prompts=256, k=5, seed=0)


def test_preference_data_kinds_match_the_verifier_and_ranks(task, data):
  prompts = task.train_prompts()[:256]
  for i in range(20):
    kinds = data.train_kinds[i]
    assert sorted(kinds) == sorted(prefs.PREFERENCE_KINDS)
    for j, kind in enumerate(kinds):
      assert data.train["ranks"][i, j] == prefs.PREFERENCE_KINDS.index(kind)
      ids = data.train["tokens"][i, j][data.train["attention_mask"][i, j] > 0]
      assert ids[0] == TOK.bos_id and ids[-1] == TOK.eos_id
      text = TOK.decode(ids[1:])
      assert text.startswith(prompts[i].text)
      completion = text[len(prompts[i].text):]
      s = task.score(prompts[i], completion)
      expected = {"correct": (1, 1), "wrong_step": (1, 1), "wrong_answer": (0, 1),
                  "no_tag": (0, 0), "truncated": (0, 0)}[kind]
      assert (s.accuracy, s.format) == expected, (kind, completion)
      if kind == "wrong_step":
        assert completion != task.demonstration(prompts[i])
      if kind == "truncated":
        assert parse_answer_tag(completion)[0] is None


def test_preference_data_heldout_is_disjoint_and_k_min_masks(task, data):
  assert data.heldout["tokens"].shape[1:] == data.train["tokens"].shape[1:]
  train_texts = {p.text for p in task.train_prompts()[:256]}
  assert not train_texts & {p.text for p in task.heldout_prompts()}
  small = prefs.make_preference_data(task, TOK, n_prompts=40, k=4, k_min=2, seed=1)
  counts = small.train["mask"].sum(axis=1)
  assert counts.min() == 2 and counts.max() == 4
  for kinds, m, r in zip(small.train_kinds, small.train["mask"], small.train["ranks"]):
    assert "correct" in kinds and [k != "" for k in kinds] == m.astype(bool).tolist()
    assert sorted(r[m > 0].tolist()) == list(range(m.sum()))
  absent = small.train["attention_mask"][small.train["mask"] == 0]
  assert absent.sum() == 0


# ---------------------------------------------------------------------- training


def _pair_accuracy_by_kind(model, split, kinds):
  scores = np.asarray(rm._eval_scores(*nnx.split(model), split))
  out = {}
  for b in range(scores.shape[0]):
    for w, lo in itertools.combinations(range(scores.shape[1]), 2):
      if split["mask"][b, w] and split["mask"][b, lo]:
        if split["ranks"][b, w] > split["ranks"][b, lo]:
          w, lo = lo, w
        out.setdefault((kinds[b][w], kinds[b][lo]), []).append(scores[b, w] > scores[b, lo])
  return {k: float(np.mean(v)) for k, v in out.items()}


@pytest.fixture(scope="module")
def trained(data):
  model = RewardModel(tiny_config(vocab_size=TOK.vocab_size), rngs=nnx.Rngs(0))
  model, history = train_reward_model(
      model, rm.preference_batches(data.train, batch_size=16, seed=0), steps=60, lr=3e-3,
      warmup_steps=10)
  return model, history


def test_trained_reward_model_beats_chance_on_heldout_pairs(data, trained):
  model, history = trained
  acc = rm.pairwise_accuracy(model, data.heldout)
  by_kind = _pair_accuracy_by_kind(model, data.heldout, data.heldout_kinds)
  print(f"\nheld-out pairwise accuracy {acc:.3f} (chance 0.5) over "
        f"{int(data.heldout['mask'].shape[0]) * 10} pairs; by pair:",
        {f"{w}>{lo}": round(a, 2) for (w, lo), a in sorted(by_kind.items())})
  assert acc > 0.75
  assert np.mean([h["loss"] for h in history[-10:]]) < np.mean([h["loss"] for h in history[:5]])
  assert by_kind[("correct", "truncated")] > 0.9 and by_kind[("correct", "no_tag")] > 0.9


@nnx.jit
def _critic_values(critic, tokens, attention):
  return critic(tokens, positions=positions_from_mask(attention), attention_mask=attention)


@nnx.jit
def _scores(model, tokens, attention):
  return model.score(tokens, positions_from_mask(attention), attention,
                     last_token_index(attention))


def test_critic_initialised_from_reward_model_equals_score_at_eos(data, trained):
  model, _ = trained
  critic = ValueModel.from_reward_model(model)
  tokens = jnp.asarray(data.heldout["tokens"][:4].reshape(20, -1))
  attention = jnp.asarray(data.heldout["attention_mask"][:4].reshape(20, -1))
  last = last_token_index(attention)
  values = _critic_values(critic, tokens, attention)
  scores = _scores(model, tokens, attention)
  # the critic's per-token forward vs the scorer's: two programs of one trunk
  assert_close_f32(values[jnp.arange(20), last], scores, ulps=256)
  # The trainer's layout is left-padded; with mask-derived positions the score is the same.
  shift = jnp.sum(attention == 0, axis=1)
  idx = (jnp.arange(tokens.shape[1])[None, :] - shift[:, None]) % tokens.shape[1]
  left_tok, left_att = jnp.take_along_axis(tokens, idx, 1), jnp.take_along_axis(attention, idx, 1)
  left_values = _critic_values(critic, left_tok, left_att)
  assert_close_f32(left_values[:, -1], scores, ulps=256)   # left- vs right-padded forward


def test_scorer_matches_batched_scores_and_composes(task, data, trained):
  model, _ = trained
  scorer = rm.RewardModelScorer(model, TOK, batch_size=8, buckets=(64,))
  scorer.warmup(64, rows=(1, 8))
  compiled = rm._score_rows._cache_size()
  prompts = task.heldout_prompts()[:3]
  completions = [task.demonstration(p) for p in prompts] + ["3+", "1\n<answer>2</answer>"]
  prompts = prompts + prompts[:2]
  batch = scorer.score_batch(prompts, completions)
  singles = np.array([scorer(p, c) for p, c in zip(prompts, completions)])
  assert_close_f32(batch, singles, ulps=256)   # 8-row vs 1-row programs of one forward
  assert rm._score_rows._cache_size() == compiled  # warmup compiled every program used
  ids = [rm.encode_sequence(TOK, p.text, c) for p, c in zip(prompts, completions)]
  tokens = np.zeros((5, 64), np.int32)
  attention = np.zeros((5, 64), np.int32)
  for i, row in enumerate(ids):
    tokens[i, :len(row)], attention[i, :len(row)] = row, 1
  ref = _scores(model, jnp.asarray(tokens), jnp.asarray(attention))
  assert_close_f32(batch, ref, ulps=256)   # the scorer's bucketed program vs a plain forward
  assert batch[0] > batch[3]  # correct demonstration above a truncated one
  out = compose([("rm", scorer, 2.0)], timeout=None)(prompts, completions)
  # compose scores the rows again in its own batches: other programs of the same forward
  assert_close_f32(out.components["rm"], batch, ulps=256)
  assert_close_f32(out.total, 2 * batch, ulps=256)


def test_checkpoint_round_trip(tmp_path, task, trained):
  model, _ = trained
  rm.save_reward_model(model, str(tmp_path / "rm"), tokenizer=TOK)
  scorer = rm.RewardModelScorer.from_checkpoint(str(tmp_path / "rm"))
  prompts = task.heldout_prompts()[:2]
  completions = [task.demonstration(p) for p in prompts]
  np.testing.assert_allclose(scorer.score_batch(prompts, completions),
                             rm.RewardModelScorer(model, TOK).score_batch(prompts, completions),
                             rtol=1e-6)
  with pytest.raises(FileNotFoundError, match="neither"):
    rm.load_reward_model(str(tmp_path))
