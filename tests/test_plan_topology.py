"""`rljax plan`'s inputs: slice names, shape presets, the command line's bad inputs (exit 2)
and the message without libtpu. None of these compile anything."""

import json
import pathlib

import pytest

from rljax.cli import main
from rljax.models import config_from_hf
from rljax.models.presets import PRESET_SOURCES, SHAPE_PRESETS, hf_config_dict, preset_name
from rljax.plan import topology as topo
from rljax.train.config import ConfigError, load_config


@pytest.mark.parametrize("name,chip,chips,shape", [
    # Google Cloud accelerator types: v4 / v5p count TensorCores (two per chip)
    ("v4-8", "v4", 4, (2, 2, 1)), ("v4-32", "v4", 16, (2, 2, 4)),
    ("v5p-8", "v5p", 4, (2, 2, 1)), ("v5p-32", "v5p", 16, (2, 2, 4)),
    ("v5p-128", "v5p", 64, (4, 4, 4)), ("v5p-1024", "v5p", 512, (8, 8, 8)),
    # v5e (v5litepod) and v6e count chips
    ("v5litepod-16", "v5e", 16, (4, 4)), ("v5e-64", "v5e", 64, (8, 8)),
    ("v5e-1", "v5e", 1, (1, 1)), ("v6e-256", "v6e", 256, (16, 16)),
    # the chip-grid form, libtpu's own
    ("v5p:4x4x4", "v5p", 64, (4, 4, 4)), ("v5e:2x2", "v5e", 4, (2, 2)),
    ("V5P:2x2x1", "v5p", 4, (2, 2, 1)), ("v5litepod:2x4", "v5e", 8, (2, 4)),
])
def test_slice_names(name, chip, chips, shape):
  t = topo.parse_topology(name)
  assert (t.chip.name, t.chips, t.shape) == (chip, chips, shape)
  assert t.libtpu_name == f"{chip}:{'x'.join(map(str, shape))}"


def test_compile_options_megacore_tori_and_single_hosts():
  assert topo.parse_topology("v4-8").compile_options() == {"chip_config_name": "megacore"}
  assert topo.parse_topology("v5p-128").compile_options()["wrap"] == (True, True, True)
  assert "wrap" not in topo.parse_topology("v5p-64").compile_options()   # 2x4x4: no torus
  assert topo.parse_topology("v5e-256").compile_options()["wrap"] == (True, True, False)
  assert topo.parse_topology("v5e-1").compile_options() == {"chips_per_host_bounds": (1, 1, 1)}


@pytest.mark.parametrize("name,needle", [
    ("v5p-7", "TensorCores"), ("v5p-6", "takes N in \\[8, 16"), ("v4-3", "v4-N"),
    ("v7-8", "unknown topology"), ("tpu", "unknown topology"), ("v5e:2x2x2", "2-D chip grid"),
    ("v5p:2x2", "3-D chip grid"), ("v9:2x2", "unknown TPU version"), ("v6e-3", "v6e-N"),
])
def test_bad_slice_names_say_what_is_accepted(name, needle):
  with pytest.raises(topo.TopologyError, match=needle):
    topo.parse_topology(name)


def test_local_and_sub_slices():
  assert topo.parse_topology("local").chip is None
  sub = topo.sub_topology(topo.parse_topology("v5p-128"), 32)
  assert (sub.shape, sub.chip.name) == ((2, 4, 4), "v5p")
  with pytest.raises(topo.TopologyError, match="share of 24 chips"):
    topo.sub_topology(topo.parse_topology("v5e-64"), 24)


def test_hbm_limit_is_the_smaller_of_published_and_usable():
  v5p, v4 = topo.CHIPS["v5p"], topo.CHIPS["v4"]
  assert v5p.hbm_limit == 95e9                      # the page's 95 GB < 95.74 GiB usable
  assert v4.hbm_limit == 30.75 * 2 ** 30            # 32 GiB published, 30.75 GiB usable
  assert all(c.source.startswith("https://cloud.google.com/tpu/docs/") for c in topo.CHIPS.values())


@pytest.mark.parametrize("name", sorted(SHAPE_PRESETS))
def test_presets_build_model_configs(name):
  cfg = config_from_hf(hf_config_dict(name))
  assert cfg.num_heads % cfg.num_kv_heads == 0 and PRESET_SOURCES[name].endswith("config.json")
  assert preset_name(PRESET_SOURCES[name].split("co/")[1].rsplit("/blob", 1)[0]) == name


def test_preset_parameter_counts_match_the_published_sizes():
  """Total parameters from the shapes, against the model cards' figures (7.61 B for
  Qwen2.5-7B, 32.5 B for Qwen2.5-32B, 8.03 B / 70.6 B for Llama-3.1)."""
  def count(name):
    c = config_from_hf(hf_config_dict(name))
    per_layer = (c.hidden_size * c.head_dim * (2 * c.num_heads + 2 * c.num_kv_heads)
                 + 3 * c.hidden_size * c.intermediate_size + 2 * c.hidden_size)
    bias = c.head_dim * (c.num_heads + 2 * c.num_kv_heads) if c.attention_bias else 0
    qk = 2 * c.head_dim if c.qk_norm else 0
    emb = c.vocab_size * c.hidden_size * (1 if c.tie_embeddings else 2)
    return c.num_layers * (per_layer + bias + qk) + emb + c.hidden_size
  for name, billions in (("qwen2.5-7b", 7.61), ("qwen2.5-32b", 32.5), ("llama-3.1-8b", 8.03),
                         ("llama-3.1-70b", 70.6), ("qwen2.5-0.5b", 0.494)):
    assert abs(count(name) / 1e9 - billions) / billions < 0.01, name


def test_hf_config_takes_a_preset_or_a_config_json(tmp_path):
  path = tmp_path / "config.json"
  path.write_text(json.dumps(SHAPE_PRESETS["qwen3-8b"]))
  for value in ("qwen3-8b", "Qwen/Qwen3-8B", str(path), str(tmp_path)):
    config = load_config("experiments/grpo.py", {"model.hf_config": value,
                                                 "sampling.max_new_tokens": 2048})
    assert config.model.hf_config == value   # 2048 tokens fit the preset's 40,960 positions
  with pytest.raises(ConfigError, match="model.hf_config='qwen9'.*neither a shape preset"):
    load_config("experiments/grpo.py", {"model.hf_config": "qwen9"})
  with pytest.raises(ConfigError, match="model.hf_path=.*model.hf_config=.*both"):
    load_config("experiments/grpo.py", {"model.hf_config": "qwen3-8b", "model.hf_path": "x"})


def _exit(argv, capsys):
  with pytest.raises(SystemExit) as e:
    main(["plan", *argv])
  return e.value.code, capsys.readouterr()


@pytest.mark.parametrize("argv,needle", [
    (["--config", "experiments/grpo.py"], "--topology NAME is required"),
    (["--config", "experiments/grpo.py", "--topology", "v5p-7"], "TensorCores"),
    (["--config", "experiments/grpo.py", "--topology", "local", "--config.algo.eps_low=2"],
     "algo.eps_low"),
    (["--config", "experiments/nope.py", "--topology", "local"], "not found"),
    (["--config", "experiments/grpo.py", "--topology", "local", "--search", "x"], "--search"),
    (["--config", "experiments/grpo.py", "--topology", "local",
      "--config.parallel.fsdp=3"], "parallel"),
])
def test_bad_input_exits_2_naming_it(argv, needle, capsys):
  code, out = _exit(argv, capsys)
  assert code == 2 and needle in out.err, out.err


def test_without_libtpu_plan_says_how_to_install_it(monkeypatch, capsys):
  monkeypatch.setattr(topo, "libtpu_installed", lambda: False)
  code, out = _exit(["--config", "experiments/grpo.py", "--topology", "v5p-8"], capsys)
  assert code == 2 and 'pip install -e ".[tpu]"' in out.err
  assert pathlib.Path("pyproject.toml").read_text().count('tpu = ["jax[tpu]==') == 1
