"""On-policy distillation kernels: the per-token reverse KL (k1) and the distillation
advantage, against NumPy references of the reverse KL and of its gradient."""

import jax
import jax.numpy as jnp
import numpy as np

from rljax.ops import distill_advantages, distill_reverse_kl


def _np_log_softmax(z):
  z = z - z.max(axis=-1, keepdims=True)
  return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def _np_reverse_kl(student_logits, teacher_logits, mask):
  """Σ_t mask_t · KL(softmax(s_t) ‖ softmax(u_t)), exact sums over the vocabulary."""
  ls, lt = _np_log_softmax(student_logits), _np_log_softmax(teacher_logits)
  return float(np.sum(mask * np.sum(np.exp(ls) * (ls - lt), axis=-1)))


def _np_grad(f, x, h=1e-5):
  """Central finite differences of a NumPy scalar function, float64."""
  g = np.zeros_like(x)
  for i in np.ndindex(*x.shape):
    up, down = x.copy(), x.copy()
    up[i] += h
    down[i] -= h
    g[i] = (f(up) - f(down)) / (2 * h)
  return g


def test_reverse_kl_is_the_masked_log_ratio():
  rng = np.random.default_rng(0)
  logp = rng.uniform(-5, -0.01, (3, 6)).astype(np.float32)
  teacher = rng.uniform(-5, -0.01, (3, 6)).astype(np.float32)
  mask = np.ones((3, 6), np.float32)
  mask[1, 4:] = 0
  teacher[1, 5] = -np.inf   # a padded position with a non-finite log-prob leaks nothing
  got = np.asarray(distill_reverse_kl(logp, teacher, mask))
  want = np.where(mask > 0, logp.astype(np.float64) - np.where(mask > 0, teacher, 0), 0.0)
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
  assert np.all(np.isfinite(got))
  adv = np.asarray(distill_advantages(logp, teacher, mask, coef=0.5))
  np.testing.assert_allclose(adv, -0.5 * want, rtol=1e-6, atol=1e-6)


def test_k1_is_unbiased_for_the_exact_reverse_kl():
  """E_{y~π_s}[log π_s(y) − log π_t(y)] = KL(π_s‖π_t), by enumeration of the vocabulary."""
  p = np.array([0.6, 0.25, 0.1, 0.05])
  q = np.array([0.1, 0.2, 0.3, 0.4])
  logp = jnp.asarray(np.log(p), jnp.float32)[:, None]
  logq = jnp.asarray(np.log(q), jnp.float32)[:, None]
  d = distill_reverse_kl(logp, logq, jnp.ones_like(logp))[:, 0]
  np.testing.assert_allclose(float(jnp.sum(jnp.asarray(p) * d)), np.sum(p * np.log(p / q)),
                             rtol=1e-5)


def _tabular_surrogate(coef, teacher_logits, mask):
  """The expected policy-gradient loss of a tabular student over T positions: every token
  v of the vocabulary is a 'sampled' row, weighted by sg(π_s(v | t)), with advantage
  distill_advantages (so the expectation is exact, no sampling noise)."""
  teacher_logp = jax.nn.log_softmax(teacher_logits, axis=-1).T          # [V, T]
  mask_bt = jnp.broadcast_to(mask[None, :], teacher_logp.shape)

  def loss(student_logits):                                              # [T, V]
    logp = jax.nn.log_softmax(student_logits, axis=-1).T                 # [V, T]: row v = token v
    adv = distill_advantages(jax.lax.stop_gradient(logp), teacher_logp, mask_bt, coef=coef)
    weight = jax.lax.stop_gradient(jnp.exp(logp))                        # π_s(v | t)
    return jnp.sum(weight * -adv * logp * mask_bt)
  return loss


def test_policy_gradient_of_the_advantage_is_the_reverse_kl_gradient():
  """∇_θ E_{y~π_θ}[−A·log π_θ(y)] = c·∇_θ Σ_t KL(π_θ(·|t) ‖ π_t(·|t)) (finite differences of
  the exact NumPy reverse KL); masked positions get no gradient."""
  rng = np.random.default_rng(1)
  t, v, coef = 3, 5, 0.7
  student = rng.normal(0, 1.5, (t, v))
  teacher = rng.normal(0, 1.5, (t, v))
  mask = np.array([1.0, 1.0, 0.0])
  loss = _tabular_surrogate(coef, jnp.asarray(teacher, jnp.float32), jnp.asarray(mask, jnp.float32))
  got = np.asarray(jax.grad(loss)(jnp.asarray(student, jnp.float32)))
  want = coef * _np_grad(lambda s: _np_reverse_kl(s, teacher, mask), student)
  np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-5)
  assert np.all(got[2] == 0)
  assert np.abs(want).max() > 1e-2   # the reference is not trivially zero


def test_term_and_gradient_vanish_when_teacher_equals_student():
  rng = np.random.default_rng(2)
  logits = rng.normal(0, 2.0, (4, 6)).astype(np.float32)
  mask = jnp.ones((4,), jnp.float32)
  loss = _tabular_surrogate(1.0, jnp.asarray(logits), mask)
  grad = np.asarray(jax.grad(loss)(jnp.asarray(logits)))
  np.testing.assert_allclose(grad, 0.0, atol=1e-6)
  logp = jax.nn.log_softmax(jnp.asarray(logits), axis=-1)
  ones = jnp.ones_like(logp)
  assert float(jnp.max(jnp.abs(distill_reverse_kl(logp, logp, ones)))) == 0.0
  assert float(jnp.max(jnp.abs(distill_advantages(logp, logp, ones, coef=3.0)))) == 0.0


def test_advantage_carries_no_gradient():
  logp = jnp.asarray([[-1.0, -2.0, -0.5]])
  teacher = jnp.asarray([[-0.3, -2.5, -1.5]])
  mask = jnp.ones_like(logp)
  grad = jax.grad(lambda lp: jnp.sum(distill_advantages(lp, teacher, mask, coef=1.0)))(logp)
  np.testing.assert_array_equal(np.asarray(grad), 0.0)
  # while the reverse-KL estimate itself is differentiable in the student's log-probs
  grad_kl = jax.grad(lambda lp: jnp.sum(distill_reverse_kl(lp, teacher, mask)))(logp)
  np.testing.assert_array_equal(np.asarray(grad_kl), 1.0)
