"""Test-session set-up shared by every test.

Eight simulated CPU devices are forced *before* JAX is imported, so sharded and
unsharded results can be compared in one process. Unsharded code simply runs on the
first device.
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
_flag = "--xla_force_host_platform_device_count=8"
if _flag not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()

# One persistent compilation cache per test session (inherited by subprocesses): the
# end-to-end tests compile the same tiny programs many times. The process that made it
# (pytest's controller; xdist's workers inherit it) removes it when it exits (~135 MB).
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  import atexit
  import shutil
  import tempfile

  os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="rljax-jax-cache-")
  atexit.register(shutil.rmtree, os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
  os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
  os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"

import hypothesis  # noqa: E402

hypothesis.settings.register_profile("rljax", max_examples=40, deadline=None, derandomize=True)
hypothesis.settings.load_profile("rljax")


import gc  # noqa: E402

import jax  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def _free_compiled_programs_between_modules():
  """One pytest process runs every module: drop each module's compiled programs and
  arrays when it ends, so the session's memory does not grow with the suite."""
  yield
  jax.clear_caches()
  gc.collect()


# The longest files first: with `-n 2 --dist loadfile` (the README's command) a long file
# picked up last would leave one worker idle at the end.
_LONGEST_FIRST = ("test_train_testbed.py", "test_parallel_multiprocess_train.py",
                  "test_train_packing.py", "test_train_multiturn.py", "test_train_lora.py")


def pytest_collection_modifyitems(config, items):
  rank = {name: i for i, name in enumerate(_LONGEST_FIRST)}
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
