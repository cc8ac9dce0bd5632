"""rljax.ops against Tunix's own registered policy losses (google-tunix 0.1.7,
`tunix/rl/algo_core.py`), on the same batch: loss values and their gradients with respect
to the log-probs (and the logits, for the entropy term). The KL estimators, entropy and
advantage estimators: tests/test_tunix_estimators.py.

Tunix's policy losses take a model and compute the log-probs themselves
(`tunix.rl.common.compute_per_token_logps`); here that function is replaced by one that
returns the test's log-probs and logits, so Tunix's loss code runs unchanged on exactly the
arrays rljax sees. Where the two conventions differ, the difference is asserted (so a
change on either side fails here) and listed in docs/kernels.md ("Against Tunix"):
- PPO (`ppo`) does not clamp the log-ratio; Tunix's `grpo` loss and rljax clamp it at ±20;
- GSPO-token clamps every token's log-ratio at ±20 before the sequence mean and the
  resulting ratio at e^10 from above (rljax: the mean at ±20, no upper clip).

Skipped, with the reason, only where Tunix cannot be imported (CI installs it: .ci/run).
"""

import pathlib
import re
import tomllib
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tunix_peer import GRPOConfig, PPOConfig, TrainExample, needs_tunix, registry, tunix_common
from tunix_peer import close as _close

from rljax.ops.aggregate import aggregate
from rljax.ops.entropy import entropy_from_logits
from rljax.ops.kl import kl_estimate
from rljax.ops.policy_loss import policy_loss

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_ci_installs_the_pinned_tunix():
  """.ci/run installs the Tunix release pinned by the `tunix` extra (it needs `--no-deps`:
  see pyproject.toml), so the cross-check below runs in CI against that release."""
  extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
  pin = next(r for r in extras["optional-dependencies"]["tunix"] if r.startswith("google-tunix"))
  ci = (REPO / ".ci" / "run").read_text()
  assert re.search(r'--no-deps\s+"?' + re.escape(pin), ci), (pin, ci)


B, T, V = 6, 7, 11
# rljax aggregation mode (and its max_len) of each Tunix `loss_agg_mode`, as grpo_loss_fn
# calls `aggregate_loss` (no custom `norm`: "-token-scale" divides by T, "-token-sum-norm"
# by the number of non-empty sequences)
AGG = {"token-mean": ("token_mean", None),
       "sequence-mean-token-mean": ("seq_mean_token_mean", None),
       "seq-mean-token-sum": ("seq_mean_token_sum", None),
       "sequence-mean-token-scale": ("seq_mean_token_sum_norm", T),
       "sequence-mean-token-sum-norm": ("seq_mean_token_sum", None)}
KL = {"kl": "k1", "mse_kl": "k2", "low_var_kl": "k3"}


class _NoParams(nnx.Module):
  """A model with no parameters: the log-probs come from the patched function."""


def _batch(seed=0):
  """Log-probs with log-ratios in [−1.5, 1.5] (both clip sides and the dual clip at c = 3
  are hit), advantages of both signs, varied lengths and one empty row."""
  rng = np.random.default_rng(seed)
  logits = rng.normal(size=(B, T, V)).astype(np.float32) * 2
  logp = rng.uniform(-3.0, -0.1, (B, T)).astype(np.float32)
  old_logp = (logp - rng.uniform(-1.5, 1.5, (B, T))).astype(np.float32)
  ref_logp = (logp - rng.uniform(-1.0, 1.0, (B, T))).astype(np.float32)
  lengths = np.array([7, 5, 1, 0, 3, 6])
  mask = (np.arange(T)[None] < lengths[:, None]).astype(np.float32)
  adv = np.array([1.3, -2.0, 0.7, 0.4, -0.9, -1.6], np.float32)
  return {k: jnp.asarray(v) for k, v in dict(logp=logp, old_logp=old_logp, ref_logp=ref_logp,
                                             mask=mask, adv=adv, logits=logits).items()}


def _tunix(loss_fn, cfg, d, logp, logits, ref=True):
  """Tunix's registered `loss_fn` on batch `d`, its log-probs and logits replaced."""
  b, t = d["mask"].shape
  example = TrainExample(
      prompt_ids=jnp.zeros((b, 2), jnp.int32), prompt_mask=jnp.ones((b, 2), bool),
      completion_ids=jnp.zeros((b, t), jnp.int32), completion_mask=d["mask"],
      advantages=d["adv"], ref_per_token_logps=d["ref_logp"] if ref else None,
      old_per_token_logps=d["old_logp"])
  fake = lambda *a, **k: (logp, logits)  # noqa: E731
  with mock.patch.object(tunix_common, "compute_per_token_logps", fake):
    return loss_fn(_NoParams(), example, cfg, pad_id=0, eos_id=1)


def _value_and_grads(fn, d):
  """fn(logp, logits) -> (loss, aux): loss, aux and ∂loss/∂logp, ∂loss/∂logits."""
  (loss, aux), grads = jax.value_and_grad(fn, argnums=(0, 1), has_aux=True)(d["logp"],
                                                                            d["logits"])
  return loss, aux, grads


def _grpo_config(*, loss_algo, agg, eps_high=None, dual=None, beta=0.0, kl="kl"):
  cfg = GRPOConfig(num_generations=2, loss_algo=loss_algo, loss_agg_mode=agg, beta=beta,
                   kl_loss_mode=kl, epsilon=0.2)
  # set as GRPOLearner and DAPOConfig do: attributes grpo_loss_fn reads when present
  cfg.temperature = 1.0
  if eps_high is not None:
    cfg.epsilon_high = eps_high
  cfg.epsilon_c = dual
  return cfg


# every aggregation mode with the plain clip; clip-higher, dual clip and each KL mode with
# two of them
GRPO_CASES = ([(agg, {}) for agg in AGG]
              + [("token-mean", dict(eps_high=0.28)),
                 ("sequence-mean-token-mean", dict(eps_high=0.28, dual=3.0)),
                 ("sequence-mean-token-scale", dict(beta=0.04, kl="kl")),
                 ("token-mean", dict(beta=0.1, kl="mse_kl")),
                 ("sequence-mean-token-mean", dict(beta=0.1, kl="low_var_kl", dual=3.0))])


@needs_tunix
@pytest.mark.parametrize("loss_algo", ["grpo", "gspo-token"])
@pytest.mark.parametrize("agg, case", GRPO_CASES,
                         ids=lambda c: c if isinstance(c, str) else ",".join(map(str, c.values())))
def test_grpo_loss_matches(loss_algo, agg, case):
  d = _batch()
  cfg = _grpo_config(loss_algo=loss_algo, agg=agg, **case)
  tunix_fn = registry.get_policy_loss_fn("grpo")
  t_loss, t_aux, t_grads = _value_and_grads(
      lambda lp, lg: _tunix(tunix_fn, cfg, d, lp, lg, ref=bool(case.get("beta"))), d)
  mode, max_len = AGG[agg]

  def rljax_loss(logp, logits):
    loss_bt, _ = policy_loss(
        logp, d["old_logp"], d["adv"], d["mask"],
        ratio_level="sequence_token" if loss_algo == "gspo-token" else "token",
        eps_low=0.2, eps_high=case.get("eps_high", 0.2), dual_clip=case.get("dual"))
    loss = aggregate(loss_bt, d["mask"], mode, max_len=max_len)
    if case.get("beta"):
      kl_bt = kl_estimate(logp, d["ref_logp"], KL[case["kl"]])
      loss = loss + case["beta"] * aggregate(kl_bt, d["mask"], mode, max_len=max_len)
    entropy = aggregate(entropy_from_logits(logits), d["mask"], mode, max_len=max_len)
    return loss, entropy

  r_loss, r_entropy, r_grads = _value_and_grads(rljax_loss, d)
  _close(t_loss, r_loss)
  _close(t_grads[0], r_grads[0])          # ∂loss/∂logp
  _close(t_aux["entropy"], r_entropy)     # reported, not in the loss: no logit gradient
  assert not np.any(t_grads[1]) and not np.any(r_grads[1])
  assert np.any(np.asarray(r_grads[0]))


@needs_tunix
@pytest.mark.parametrize("dual, entropy_coef", [(None, None), (3.0, None), (3.0, 0.01),
                                                (None, 0.05)])
def test_ppo_loss_matches(dual, entropy_coef):
  """`ppo`: per-token advantages (GAE's), token-mean, clip-higher, dual clip, entropy bonus
  on the logits (its KL goes into the reward, PPOLearner; PPOConfig has no `kl_coef`, so the
  loss adds none)."""
  d = _batch(1)
  wobble = jnp.asarray(np.random.default_rng(7).uniform(0.5, 1.5, (B, T)), jnp.float32)
  d["adv"] = d["adv"][:, None] * wobble
  cfg = PPOConfig(epsilon_low=0.2, epsilon_high=0.28, epsilon_c=dual, entropy_coef=entropy_coef)
  tunix_fn = registry.get_policy_loss_fn("ppo")
  t_loss, _, t_grads = _value_and_grads(lambda lp, lg: _tunix(tunix_fn, cfg, d, lp, lg), d)

  def rljax_loss(logp, logits):
    loss_bt, _ = policy_loss(logp, d["old_logp"], d["adv"], d["mask"], eps_low=0.2,
                             eps_high=0.28, dual_clip=dual)
    loss = aggregate(loss_bt, d["mask"], "token_mean")
    if entropy_coef:
      loss = loss - entropy_coef * aggregate(entropy_from_logits(logits), d["mask"],
                                             "token_mean")
    return loss, None

  r_loss, _, r_grads = _value_and_grads(rljax_loss, d)
  _close(t_loss, r_loss)
  _close(t_grads[0], r_grads[0])
  _close(t_grads[1], r_grads[1])          # the entropy term's gradient through the logits
  assert np.any(np.asarray(r_grads[1])) == bool(entropy_coef)


def _one_token(log_ratio, adv, *, logp=-1.0):
  """A batch of one sequence whose single token has the given log-ratio."""
  d = {"logp": jnp.full((1, 1), logp), "old_logp": jnp.full((1, 1), logp - log_ratio),
       "ref_logp": jnp.full((1, 1), logp), "mask": jnp.ones((1, 1)),
       "adv": jnp.full((1,), adv), "logits": jnp.zeros((1, 1, 3))}
  return d


@needs_tunix
def test_log_ratio_clamp_ppo_none_grpo_20():
  """A = −1, log r = 25: loss = |A|·r on the unclipped branch. Tunix `ppo` uses e^25,
  Tunix `grpo` and rljax clamp at e^20 (rljax.ops.ratios.LOG_RATIO_CLAMP)."""
  d = _one_token(25.0, -1.0)
  ppo, _ = _tunix(registry.get_policy_loss_fn("ppo"), PPOConfig(), d, d["logp"], d["logits"])
  grpo, _ = _tunix(registry.get_policy_loss_fn("grpo"),
                   _grpo_config(loss_algo="grpo", agg="token-mean"), d, d["logp"], d["logits"],
                   ref=False)
  loss_bt, _ = policy_loss(d["logp"], d["old_logp"], d["adv"], d["mask"])
  _close(ppo, np.exp(np.float32(25.0)), rtol=1e-5)
  _close(grpo, np.exp(np.float32(20.0)), rtol=1e-5)
  _close(loss_bt[0, 0], grpo, rtol=1e-6)


@needs_tunix
def test_gspo_token_differs_beyond_its_clamps():
  """Tunix's GSPO-token clamps each token's log-ratio at ±20 before the sequence mean and
  the ratio at e^10 from above; rljax clamps the mean at ±20 only."""
  cfg = _grpo_config(loss_algo="gspo-token", agg="token-mean")
  fn = registry.get_policy_loss_fn("grpo")

  def both(log_ratios, adv):
    lr = jnp.asarray([log_ratios], jnp.float32)
    d = {"logp": jnp.full((1, 2), -1.0), "old_logp": -1.0 - lr, "ref_logp": jnp.zeros((1, 2)),
         "mask": jnp.ones((1, 2)), "adv": jnp.full((1,), adv), "logits": jnp.zeros((1, 2, 3))}
    t, _, tg = _value_and_grads(lambda lp, lg: _tunix(fn, cfg, d, lp, lg, ref=False), d)
    r, _, rg = _value_and_grads(lambda lp, lg: (aggregate(policy_loss(
        lp, d["old_logp"], d["adv"], d["mask"], ratio_level="sequence_token")[0], d["mask"],
        "token_mean"), None), d)
    return (t, tg[0]), (r, rg[0])

  # the sequence log-ratio 12 (< 20): Tunix caps the token ratio at e^10, gradient 0
  (t, tg), (r, rg) = both([12.0, 12.0], -1.0)
  _close(t, np.exp(np.float32(10.0)), rtol=1e-5)
  _close(r, np.exp(np.float32(12.0)), rtol=1e-5)
  assert not np.any(tg) and np.all(np.asarray(rg) > 0)
  # token log-ratios 30 and −26: Tunix's mean (20 − 20)/2 = 0, rljax's (30 − 26)/2 = 2
  (t, _), (r, _) = both([30.0, -26.0], -1.0)
  _close(t, 1.0, rtol=1e-6)
  _close(r, np.exp(np.float32(2.0)), rtol=1e-5)
  # within both clamps the two agree
  (t, tg), (r, rg) = both([0.5, -0.1], -1.0)
  _close(t, r)
  _close(tg, rg)
