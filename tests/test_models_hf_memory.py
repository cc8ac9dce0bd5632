"""`load_hf`'s host memory: one tensor at a time on the host, parameters in XLA's buffers."""

import tracemalloc

import jax
import ml_dtypes
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file, save_file

from rljax.models import Decoder, ModelConfig, abstract_hf, load_hf, save_hf
from rljax.models.hf import read_tensor, safetensors_header

# 8 layers whose MLP weights dominate: one layer's gate is 1/8 of the stacked gate
CFG = ModelConfig(vocab_size=64, hidden_size=64, intermediate_size=16384, num_layers=8,
                  num_heads=4, num_kv_heads=2, head_dim=16, tie_embeddings=True)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("ckpt"))
  model = Decoder(CFG.replace(scan_layers=False), rngs=nnx.Rngs(0))
  save_hf(model, CFG, path)
  return path, model


def test_read_tensor_equals_safetensors_reader(tmp_path):
  rng = np.random.default_rng(0)
  tensors = {"f32": rng.normal(size=(3, 5)).astype(np.float32),
             "bf16": rng.normal(size=(4,)).astype(ml_dtypes.bfloat16),
             "i64": rng.integers(-9, 9, size=(2, 2, 3)), "u8": np.arange(7, dtype=np.uint8),
             "scalar": np.asarray(2.5, np.float32)}
  file = str(tmp_path / "t.safetensors")
  save_file({k: v for k, v in tensors.items() if k != "bf16"}, file, metadata={"x": "y"})
  reference = load_file(file)
  header = safetensors_header(file)
  assert set(header[0]) == set(reference)
  for name, want in reference.items():
    got = read_tensor(file, name, header)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
  # bfloat16 (safetensors' numpy writer has no bfloat16): a hand-written file
  raw = tensors["bf16"].tobytes()
  head = b'{"w":{"dtype":"BF16","shape":[4],"data_offsets":[0,8]}}'
  with open(tmp_path / "b.safetensors", "wb") as f:
    f.write(len(head).to_bytes(8, "little") + head + raw)
  got = read_tensor(str(tmp_path / "b.safetensors"), "w")
  assert got.dtype == ml_dtypes.bfloat16
  np.testing.assert_array_equal(got, tensors["bf16"])


@pytest.mark.parametrize("scan_layers", [True, False])
def test_load_keeps_one_tensor_on_the_host(checkpoint, scan_layers):
  """The host's peak during the load (tracemalloc: NumPy's buffers and Python's objects)
  is about one HF tensor (one layer's MLP weight, 4 MB), not a stacked parameter (8
  layers: 32 MB) nor the checkpoint (100 MB)."""
  path, reference = checkpoint
  layer_bytes = CFG.hidden_size * CFG.intermediate_size * 4
  tracemalloc.start()
  try:
    model, _ = load_hf(path, scan_layers=scan_layers)
    _, peak = tracemalloc.get_traced_memory()
  finally:
    tracemalloc.stop()
  assert peak < 2.5 * layer_bytes, (peak, layer_bytes)
  tokens = jax.numpy.arange(12).reshape(2, 6) % CFG.vocab_size
  positions = jax.numpy.broadcast_to(jax.numpy.arange(6), (2, 6))
  ones = jax.numpy.ones((2, 6), jax.numpy.int32)
  # the same weights (a scanned model's logits differ from the per-layer one's in rounding)
  np.testing.assert_allclose(model(tokens, positions=positions, attention_mask=ones),
                             reference(tokens, positions=positions, attention_mask=ones),
                             rtol=0, atol=0 if not scan_layers else 1e-5)


def test_loaded_parameters_are_donated_in_place(checkpoint):
  """Every parameter lives in a buffer XLA allocated: a donating step (the update) writes
  its result into it, where a NumPy-owned buffer adopted by XLA would need a new one."""
  path, _ = checkpoint
  model, _ = load_hf(path)
  step = jax.jit(lambda x: x * 2, donate_argnums=0)
  for leaf in jax.tree.leaves(nnx.state(model)):
    before = leaf.unsafe_buffer_pointer()
    assert step(leaf).unsafe_buffer_pointer() == before


@pytest.mark.parametrize("scan_layers", [True, False])
def test_abstract_hf_is_load_hf_without_the_parameters(checkpoint, scan_layers):
  """`abstract_hf`: the loaded model's structure, shapes and dtypes, nothing allocated."""
  path, _ = checkpoint
  abstract, cfg = abstract_hf(path, scan_layers=scan_layers)
  model, loaded_cfg = load_hf(path, scan_layers=scan_layers)
  assert cfg == loaded_cfg
  a, m = nnx.state(abstract), nnx.state(model)
  assert jax.tree.structure(a) == jax.tree.structure(m)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(m), strict=True):
    assert isinstance(x, jax.ShapeDtypeStruct) and (x.shape, x.dtype) == (y.shape, y.dtype)
