"""Token masks and sample weights: forking tokens, PSR/NSR/W-REINFORCE, overlong filter."""

import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rljax.ops import masks

RNG = np.random.default_rng(0)


def np_high_entropy_mask(h, m, rho):
  """Keep valid tokens whose entropy is among the ⌈ρN⌉ largest (Wang et al. 2025)."""
  vals = np.sort(h[m > 0])[::-1]
  if vals.size == 0:
    return np.zeros_like(h)
  k = max(1, int(np.ceil(rho * vals.size)))
  return ((m > 0) & (h >= vals[k - 1])).astype(np.float32)


@pytest.mark.parametrize("rho", [0.05, 0.2, 0.5, 1.0])
def test_high_entropy_mask_matches_reference(rho):
  h = RNG.gamma(1.0, size=(4, 9)).astype(np.float32)
  m = (RNG.random((4, 9)) > 0.3).astype(np.float32)
  out = np.asarray(masks.high_entropy_mask(h, m, top_fraction=rho))
  np.testing.assert_array_equal(out, np_high_entropy_mask(h, m, rho))
  assert out.sum() == max(1, int(np.ceil(rho * m.sum())))  # no ties in continuous data
  assert np.all(out <= m)


def test_high_entropy_mask_hand_example_and_edge_cases():
  h = jnp.array([[0.1, 2.0, 0.3, 9.0], [1.5, 0.2, 0.05, 0.0]])
  m = jnp.array([[1, 1, 1, 0], [1, 1, 1, 1]])  # the 9.0 is masked and must not count
  # 7 valid tokens, ρ = 0.2 → ⌈1.4⌉ = 2 kept: 2.0 and 1.5.
  np.testing.assert_array_equal(masks.high_entropy_mask(h, m, top_fraction=0.2),
                                [[0, 1, 0, 0], [1, 0, 0, 0]])
  assert float(jnp.sum(masks.high_entropy_mask(h, jnp.zeros((2, 4)), top_fraction=0.2))) == 0
  with pytest.raises(ValueError):
    masks.high_entropy_mask(h, m, top_fraction=0.0)


def test_psr_nsr_weights_presets():
  a = jnp.array([1.0, -1.0, 0.0, 0.5])  # advantages; 0 counts as negative (its term is 0)
  for name, (pos, neg) in masks.PSR_NSR_PRESETS.items():
    w = masks.psr_nsr_weights(a, positive_weight=pos, negative_weight=neg)
    np.testing.assert_allclose(w, [pos, neg, neg, pos], err_msg=name)
  # {0, 1} scores: wrong answers (0) are negative samples.
  w = masks.psr_nsr_weights(jnp.array([[1, 0]]), positive_weight=0.1, negative_weight=1.0)
  np.testing.assert_allclose(w, [[0.1, 1.0]])


def test_w_reinforce_objective_weighting():
  # Zhu et al. Sec. 5: L = λ·L_PSR + L_NSR with rewards ±1 → weighted REINFORCE gradient.
  logp = jnp.array([-0.5, -1.0, -2.0])
  r = jnp.array([1.0, -1.0, 1.0])
  w = masks.psr_nsr_weights(r, positive_weight=0.1, negative_weight=1.0)
  g = jax.grad(lambda lp: -(w * r * lp).sum())(logp)
  np.testing.assert_allclose(g, [-0.1, 1.0, -0.1])


def test_overlong_filter_mask():
  m = jnp.ones((3, 4), jnp.int32)
  out = masks.overlong_filter_mask(m, jnp.array([False, True, False]))
  np.testing.assert_array_equal(out, [[1] * 4, [0] * 4, [1] * 4])
  assert out.dtype == m.dtype


_hem = jax.jit(lambda h, m: masks.high_entropy_mask(h, m, top_fraction=0.3))


@given(h=hnp.arrays(np.float32, (3, 5), elements=st.floats(0, 5, width=32)),
       m=hnp.arrays(np.bool_, (3, 5)),
       junk=hnp.arrays(np.float32, (3, 5), elements=st.floats(width=32)))
def test_masked_positions_never_change_outputs(h, m, junk):
  np.testing.assert_array_equal(_hem(h, m), _hem(np.where(m, h, junk), m))
