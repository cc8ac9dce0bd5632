"""rljax.ops' KL estimators, entropy and advantage estimators against Tunix's own
(google-tunix 0.1.7, `tunix/rl/common.py`, `tunix/rl/algo_core.py`): values and
gradients on the same arrays; where the conventions differ the difference is asserted
(docs/kernels.md, "Against Tunix"). The policy losses: tests/test_tunix_losses.py.
Skipped, with the reason, only where Tunix cannot be imported (CI installs it: .ci/run)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tunix_peer import algo_core, needs_tunix, registry, tunix_common
from tunix_peer import close as _close

from rljax.ops.advantages import gae, group_advantages, rloo_advantages, whiten
from rljax.ops.entropy import entropy_from_logits
from rljax.ops.kl import kl_estimate
from rljax.ops.stats import masked_mean, masked_var

KL = {"kl": "k1", "mse_kl": "k2", "low_var_kl": "k3"}


def _arrays(seed, b=6, t=7, v=11):
  """Log-probs, reference log-probs, logits and a mask with one empty row."""
  rng = np.random.default_rng(seed)
  logp = rng.uniform(-3.0, -0.1, (b, t)).astype(np.float32)
  lengths = np.array([7, 5, 1, 0, 3, 6])
  mask = (np.arange(t)[None] < lengths[:, None]).astype(np.float32)
  return {"logp": jnp.asarray(logp), "ref_logp": jnp.asarray(logp - rng.uniform(-1, 1, (b, t))),
          "logits": jnp.asarray(rng.normal(size=(b, t, v)).astype(np.float32) * 2),
          "mask": jnp.asarray(mask)}


@needs_tunix
@pytest.mark.parametrize("kind", list(KL))
def test_kl_estimators(kind):
  d = _arrays(2)
  t = tunix_common.compute_kl_divergence(d["logp"], d["ref_logp"], kind)
  _close(t, kl_estimate(d["logp"], d["ref_logp"], KL[kind]))
  g_t = jax.grad(lambda lp: tunix_common.compute_kl_divergence(lp, d["ref_logp"], kind).sum())
  g_r = jax.grad(lambda lp: kl_estimate(lp, d["ref_logp"], KL[kind]).sum())
  _close(g_t(d["logp"]), g_r(d["logp"]))


@needs_tunix
def test_low_var_kl_clamps():
  """d = logπ − logπ_ref = −15: Tunix's `low_var_kl` is k3 unclamped (e^15 − 16) unless
  `kl_clamp_value`; rljax's `low_var_kl` clamps the output at 10 (verl), its `k3` does not;
  with `clamp_value=10` Tunix equals rljax's `low_var_kl`."""
  logp, ref = jnp.full((1, 1), -16.0), jnp.full((1, 1), -1.0)
  k3 = np.exp(np.float32(15.0)) - 15.0 - 1.0
  _close(tunix_common.compute_kl_divergence(logp, ref, "low_var_kl"), k3, rtol=1e-6)
  _close(kl_estimate(logp, ref, "k3"), k3, rtol=1e-6)
  _close(kl_estimate(logp, ref, "low_var_kl"), 10.0)
  _close(tunix_common.compute_kl_divergence(logp, ref, "low_var_kl", clamp_value=10.0), 10.0)


@needs_tunix
def test_entropy_from_logits():
  logits = _arrays(3)["logits"]
  _close(algo_core.compute_entropy_from_logits(logits), entropy_from_logits(logits))
  g_t = jax.grad(lambda x: algo_core.compute_entropy_from_logits(x).sum())(logits)
  _close(g_t, jax.grad(lambda x: entropy_from_logits(x).sum())(logits))


GROUPS = np.array([[0.2, 1.0, 0.0, 0.5], [1.0, 1.0, 1.0, 1.0], [0.0, 3.0, -1.0, 2.5]],
                  np.float32)


@needs_tunix
def test_grpo_drgrpo_rloo_advantages():
  """Group mean, unbiased std, ε = 1e-6 outside the root (GRPO); mean only (Dr.GRPO);
  leave-one-out mean (RLOO), rewards flat [B·G] on Tunix's side."""
  flat = GROUPS.reshape(-1)
  g = GROUPS.shape[1]
  est = registry.get_advantage_estimator
  _close(est("grpo")(flat, g), np.asarray(group_advantages(jnp.asarray(GROUPS))).reshape(-1))
  _close(est("drgrpo")(jnp.asarray(flat), g),
         np.asarray(group_advantages(jnp.asarray(GROUPS), scale_by_std=False)).reshape(-1))
  _close(est("rloo")(jnp.asarray(flat), g),
         np.asarray(rloo_advantages(jnp.asarray(GROUPS))).reshape(-1))
  assert not np.any(np.asarray(est("grpo")(flat, g))[4:8])   # equal scores: 0, not NaN


@needs_tunix
def test_one_sample_groups():
  """G = 1: Tunix's GRPO advantage is NaN (ddof = 1 std of one value) and its RLOO 0;
  rljax: GRPO r/(1 + ε) (mean 0, std 1), RLOO 0."""
  scores = np.array([0.5, -1.0, 2.0], np.float32)
  with np.errstate(invalid="ignore", divide="ignore"), pytest.warns(RuntimeWarning):
    t = registry.get_advantage_estimator("grpo")(scores, 1)
  assert np.all(np.isnan(t))
  _close(group_advantages(jnp.asarray(scores)[:, None])[:, 0], scores / (1 + 1e-6))
  assert not np.any(np.asarray(registry.get_advantage_estimator("rloo")(jnp.asarray(scores), 1)))
  assert not np.any(np.asarray(rloo_advantages(jnp.asarray(scores)[:, None])))


@needs_tunix
def test_gae_advantages_whitened_with_bessel():
  """Tunix's `gae`: rljax `gae` (same recursion, masked positions skipped, no bootstrap
  after the last token), then whitened with the unbiased (ddof = 1) masked variance; rljax's
  `whiten` uses the biased one, so the two differ by sqrt((n − 1)/n) over the n tokens."""
  d = _arrays(4)
  rng = np.random.default_rng(5)
  rewards = jnp.asarray(rng.normal(size=d["mask"].shape), jnp.float32)
  values = jnp.asarray(rng.normal(size=d["mask"].shape), jnp.float32)
  mask = d["mask"]
  t_adv, t_ret = registry.get_advantage_estimator("gae")(rewards, values, mask, 0.99, 0.95)
  r_adv, r_ret = gae(rewards, values, mask, gamma=0.99, lam=0.95)
  keep = np.asarray(mask) > 0
  _close(np.asarray(t_ret)[keep], np.asarray(r_ret)[keep])
  mean, var1 = masked_mean(r_adv, mask), masked_var(r_adv, mask, ddof=1)
  _close(np.asarray(t_adv)[keep], np.asarray((r_adv - mean) * jax.lax.rsqrt(var1 + 1e-8))[keep],
         rtol=1e-4, atol=1e-5)
  n = keep.sum()
  _close(np.asarray(t_adv)[keep], np.asarray(whiten(r_adv, mask))[keep] * np.sqrt((n - 1) / n),
         rtol=1e-4, atol=1e-5)
