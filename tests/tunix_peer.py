"""Tunix, the peer that tests/test_tunix_*.py check rljax.ops against: its modules when
they can be imported, else the reason the tests skip (CI installs Tunix: .ci/run)."""

import numpy as np
import pytest

try:
  from tunix.rl import algo_core
  from tunix.rl import common as tunix_common
  from tunix.rl import function_registry as registry
  from tunix.rl.grpo.grpo_learner import GRPOConfig, TrainExample
  from tunix.rl.ppo.ppo_learner import PPOConfig
  MISSING = None
except ImportError as err:   # the reason the cross-checks are skipped
  algo_core = tunix_common = registry = GRPOConfig = TrainExample = PPOConfig = None
  MISSING = (f"Tunix cannot be imported ({err}): pip install -e '.[tunix-losses]' && "
             "pip install --no-deps google-tunix==0.1.7, as .ci/run does")
needs_tunix = pytest.mark.skipif(MISSING is not None, reason=str(MISSING))


def close(a, b, rtol=2e-5, atol=1e-6):
  np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=atol)
