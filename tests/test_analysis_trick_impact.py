"""Trick impact: effective gradient weights on hand-built batches with known answers."""

import numpy as np
import pytest
from tolerances import assert_close_f32

from rljax.analysis import trick_impact as ti
from rljax.analysis.plots import plot_impact

BASE = ti.LossVariant(name="symmetric", loss_agg="token_mean")


def _ppo_weight_ref(ratio, adv_bt, mask, *, eps_low, eps_high):
  """−∂L/∂logπ of token-mean PPO from the paper's min(ρA, clip(ρ)A): A·ρ/N where the
  unclipped branch is active, else 0 (NumPy, written from the equation)."""
  active = np.where(adv_bt > 0, ratio <= 1 + eps_high, ratio >= 1 - eps_low)
  return np.where((mask > 0) & active, adv_bt * ratio / mask.sum(), 0.0)


def _clip_batch():
  # Row 0-1: positive advantage; row 2-3: negative. Old probabilities per column; DAPO's
  # Clip-Higher example (arXiv:2503.14476 §3.1): p_old = 0.01 tokens can barely move under
  # ε_high = 0.2.
  p_old = np.array([[0.01, 0.01, 0.01, 0.01, 0.9],
                    [0.02, 0.02, 0.6, 0.6, 0.9],
                    [0.01, 0.01, 0.5, 0.9, 0.9],
                    [0.02, 0.6, 0.6, 0.9, 0.9]])
  ratio = np.array([[1.0, 1.25, 1.27, 1.5, 1.05],
                    [1.1, 1.22, 1.19, 1.3, 1.1],
                    [1.25, 1.27, 0.7, 0.9, 1.05],
                    [1.5, 1.25, 0.75, 1.0, 1.1]])
  adv = np.array([1.0, 0.5, -1.0, -0.5])
  mask = np.ones_like(p_old)
  mask[1, 3] = 0.0  # a padded position
  old = np.log(p_old)
  return old + np.log(ratio), old, adv, mask, ratio


def test_clip_higher_raises_only_positive_tokens_between_the_bounds():
  logp, old, adv, mask, ratio = _clip_batch()
  adv_bt = np.broadcast_to(adv[:, None], mask.shape)
  entropy = np.linspace(0.1, 2.0, mask.size).reshape(mask.shape)
  trick = BASE.replace(name="clip-higher", eps_high=0.28)
  w_base = ti.effective_weights(BASE, logp, old, adv, mask)
  w_trick = ti.effective_weights(trick, logp, old, adv, mask)
  np.testing.assert_allclose(w_base, _ppo_weight_ref(ratio, adv_bt, mask, eps_low=0.2,
                                                      eps_high=0.2), rtol=1e-5, atol=1e-8)
  np.testing.assert_allclose(w_trick, _ppo_weight_ref(ratio, adv_bt, mask, eps_low=0.2,
                                                       eps_high=0.28), rtol=1e-5, atol=1e-8)
  freed = (mask > 0) & (adv_bt > 0) & (ratio > 1.2) & (ratio <= 1.28)
  assert freed.sum() == 3  # (0,1), (0,2), (1,1): all low-probability tokens
  delta = w_trick - w_base
  assert np.all(delta[freed] > 0) and np.all(w_base[freed] == 0)
  np.testing.assert_array_equal(delta[~freed], 0.0)

  report = ti.impact_report(trick, BASE, logp_bt=logp, old_logp_bt=old, advantages=adv,
                           mask=mask, entropy_bt=entropy)
  changed = np.argwhere(report.token_delta_sum != 0)
  assert {tuple(c[:2]) for c in changed} == {(0, 0)}  # A>0, p_old in [0, 0.1)
  np.testing.assert_allclose(report.token_delta_sum.sum(), delta.sum(), rtol=1e-6)
  np.testing.assert_allclose(report.token_delta_sum[0, 0].sum(),
                             (adv_bt * ratio)[freed].sum() / mask.sum(), rtol=1e-5)
  assert report.token_count.sum() == mask.sum()
  table = ti.format_impact_table(report)
  promoted = [row for row in table.splitlines() if row.endswith("| promotes |")]
  assert promoted and all(row.startswith("| A>0 | [0, 0.1)") for row in promoted)
  assert "suppresses" not in table


def _length_batch():
  lengths = np.array([2, 4, 8, 8])
  mask = (np.arange(8)[None] < lengths[:, None]).astype(np.float32)
  old = np.log(np.full(mask.shape, 0.5))
  adv = np.array([1.0, -1.0, 1.0, -1.0])
  return old, adv, mask, lengths


def test_token_mean_shifts_weight_towards_long_sequences():
  old, adv, mask, lengths = _length_batch()
  seq_mean = ti.LossVariant(name="seq_mean_token_mean", loss_agg="seq_mean_token_mean")
  tok_mean = ti.LossVariant(name="token_mean", loss_agg="token_mean")
  w_seq = ti.effective_weights(seq_mean, old, old, adv, mask)
  w_tok = ti.effective_weights(tok_mean, old, old, adv, mask)
  per_seq_seq = np.abs(w_seq).sum(-1)
  per_seq_tok = np.abs(w_tok).sum(-1)
  np.testing.assert_allclose(per_seq_seq, 1.0 / 4, rtol=1e-6)  # |A| / B for every length
  np.testing.assert_allclose(per_seq_tok, lengths / lengths.sum(), rtol=1e-6)
  report = ti.impact_report(tok_mean, seq_mean, logp_bt=old, old_logp_bt=old, advantages=adv,
                           mask=mask, entropy_bt=np.ones(mask.shape))
  assert report.lengths.labels == ("2", "4", "8")
  np.testing.assert_array_equal(report.lengths.count, [1, 1, 2])
  d = report.lengths.delta_abs
  assert d[0] < 0 < d[2] and np.all(np.diff(d) > 0)
  assert_close_f32(d.sum(), 0.0, ulps=16, scale=1.0)  # total |w| is |A| = 1 in both


@pytest.mark.parametrize("mode,scale", [
    ("token_mean", lambda n, lengths, b: np.full(b, 1.0 / n)),
    ("seq_mean_token_mean", lambda n, lengths, b: 1.0 / (lengths * b)),
    ("seq_mean_token_sum", lambda n, lengths, b: np.full(b, 1.0 / b)),
    ("seq_mean_token_sum_norm", lambda n, lengths, b: np.full(b, 1.0 / (8 * b))),
])
def test_on_policy_weights_are_advantage_over_normaliser(mode, scale):
  old, adv, mask, lengths = _length_batch()
  v = ti.LossVariant(loss_agg=mode, max_len=8)
  w = ti.effective_weights(v, old, old, adv, mask)
  ref = adv[:, None] * scale(mask.sum(), lengths, len(adv))[:, None] * mask
  np.testing.assert_allclose(w, ref, rtol=1e-6, atol=1e-9)
  # REINFORCE has the same on-policy gradient as PPO (ratio 1, nothing clipped).
  w_pg = ti.effective_weights(v.replace(policy_loss="reinforce"), old, old, adv, mask)
  np.testing.assert_allclose(w_pg, ref, rtol=1e-6, atol=1e-9)


def test_entropy_mask_zeroes_exactly_the_low_entropy_tokens():
  old, adv, mask, _ = _length_batch()
  rng = np.random.default_rng(0)
  entropy = rng.permutation(mask.size).reshape(mask.shape).astype(np.float64) / 10.0
  trick = BASE.replace(name="top-25% entropy", high_entropy_fraction=0.25)
  w_base = ti.effective_weights(BASE, old, old, adv, mask)
  w_trick = ti.effective_weights(trick, old, old, adv, mask, entropy_bt=entropy)
  valid = mask > 0
  k = int(np.ceil(0.25 * valid.sum()))
  tau = np.sort(entropy[valid])[::-1][k - 1]
  kept = valid & (entropy >= tau)
  assert kept.sum() == k
  np.testing.assert_array_equal(w_trick[kept], w_base[kept])
  np.testing.assert_array_equal(w_trick[~kept], 0.0)
  assert np.all(w_base[valid & ~kept] != 0)
  with pytest.raises(ValueError, match="entropy_bt"):
    ti.effective_weights(trick, old, old, adv, mask)


def test_psr_nsr_and_overlong_filter_weights():
  old, adv, mask, _ = _length_batch()
  w = ti.effective_weights(BASE, old, old, adv, mask)
  w_nsr = ti.effective_weights(BASE.replace(psr_weight=0.0), old, old, adv, mask)
  positive = np.broadcast_to(adv[:, None] > 0, mask.shape)
  np.testing.assert_array_equal(w_nsr[positive], 0.0)
  np.testing.assert_array_equal(w_nsr[~positive], w[~positive])
  w_psr = ti.effective_weights({"nsr_weight": 0.1, "loss_agg": "token_mean"},
                               old, old, adv, mask)
  np.testing.assert_allclose(w_psr[~positive], 0.1 * w[~positive], rtol=1e-6)
  truncated = np.array([False, False, True, False])
  w_filt = ti.effective_weights(BASE.replace(overlong_filter=True), old, old, adv, mask,
                                truncated_b=truncated)
  np.testing.assert_array_equal(w_filt[2], 0.0)
  kept_tokens = mask.sum() - mask[2].sum()  # token_mean renormalises over kept tokens
  np.testing.assert_allclose(w_filt[[0, 1, 3]], (adv[:, None] * mask / kept_tokens)[[0, 1, 3]],
                             rtol=1e-6)


def test_masked_positions_never_change_weights_or_report(tmp_path):
  logp, old, adv, mask, _ = _clip_batch()
  entropy = np.linspace(0.1, 2.0, mask.size).reshape(mask.shape)
  adv_bt = np.broadcast_to(adv[:, None], mask.shape).copy()
  trick = BASE.replace(name="gspo", policy_loss="gspo", eps_low=3e-4, eps_high=4e-4)
  kw = dict(advantages=adv_bt, mask=mask)
  clean = ti.impact_report(trick, BASE, logp_bt=logp, old_logp_bt=old, entropy_bt=entropy, **kw)
  dirty_in = {name: np.where(mask > 0, x, 7.5) for name, x in
              (("logp_bt", logp), ("old_logp_bt", old), ("entropy_bt", entropy))}
  dirty = ti.impact_report(trick, BASE, **dirty_in, **kw)
  np.testing.assert_allclose(dirty.w_trick_bt, clean.w_trick_bt, rtol=1e-6)
  np.testing.assert_allclose(dirty.token_delta_sum, clean.token_delta_sum, rtol=1e-6,
                             atol=1e-9)
  assert ti.format_impact_table(dirty) == ti.format_impact_table(clean)
  np.testing.assert_array_equal(clean.w_trick_bt[mask == 0], 0.0)
  path = plot_impact(clean, tmp_path / "impact.png")
  assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000


def test_variant_from_dict_and_config_checks_fields():
  with pytest.raises(ValueError, match="eps_hgih"):
    ti.as_variant({"eps_hgih": 0.28})
  from ml_collections import ConfigDict
  config = ConfigDict({"algo": dict(
      policy_loss="ppo", ratio_level="token", eps_low=0.2, eps_high=0.28, dual_clip=0.0,
      ratio_cap=0.0, loss_agg="token_mean", high_entropy_fraction=0.2, psr_weight=1.0,
      nsr_weight=1.0, overlong_filter=True), "sampling": {"max_new_tokens": 16}})
  v = ti.variant_from_config(config, name="dapo")
  assert v == ti.LossVariant(name="dapo", eps_high=0.28, loss_agg="token_mean", max_len=16,
                             high_entropy_fraction=0.2, overlong_filter=True)
