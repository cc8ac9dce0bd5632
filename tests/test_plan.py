"""`rljax plan` on TPU topologies (compiled here by libtpu, nothing runs): per-chip state
bytes and FLOPs against counts written from the model's shapes, the `--json` object's
stable fields, and exit status 3 with the largest buffers and a change that fits."""

import contextlib
import importlib.util
import io
import json

import pytest

from rljax.cli import main

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None,
    reason='libtpu (the TPU compiler) is not installed: pip install -e ".[tpu]"')

# hidden / heads / MLP widths whose per-chip shards are whole (8, 128) tiles, so the
# compiler's byte counts carry no padding
D, F, H, K, DH, V, L = 512, 1024, 4, 2, 128, 128, 2
TINY = {"model.hidden_size": D, "model.intermediate_size": F, "model.num_heads": H,
        "model.num_kv_heads": K, "model.head_dim": DH, "model.vocab_size": V,
        "model.num_layers": L, "sampling.prompts_per_iteration": 8, "sampling.n": 4,
        "algo.minibatches": 4, "parallel.data": 1, "parallel.fsdp": 4,
        # S = 16 prompt + 112 response = 128: whole splash tiles (no padded attention)
        "sampling.max_new_tokens": 112}


def _plan(topology, *extra, **overrides):
  """(exit status, stdout) of `rljax plan` in this process."""
  argv = ["plan", "--config", "experiments/grpo.py", "--topology", topology, *extra]
  argv += [f"--config.{k}={v}" for k, v in dict(TINY, **overrides).items()]
  out = io.StringIO()
  with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as e:
    main(argv)
  return e.value.code, out.getvalue()


# scanned layers (the default) on both chips, and the layers as a Python loop on one: the
# update's FLOPs count the scan's body once per layer (XLA's own cost analysis counts it once)
@pytest.fixture(scope="module", params=[("v5e:2x2", True), ("v5p:2x2x1", True),
                                        ("v5e:2x2", False)], ids=lambda p: f"{p[0]}-scan{p[1]}")
def planned(request):
  topology, scan = request.param
  code, out = _plan(topology, "--json", **{"model.scan_layers": scan})
  assert out.count("\n") == 1   # --json: one object, one line
  return code, json.loads(out)


def _matmul_params():
  per_layer = D * DH * (2 * H + 2 * K) + 3 * D * F
  return L * per_layer + D * V


def test_parameter_and_optimizer_bytes_per_chip_match_a_count(planned):
  code, plan = planned
  assert code == 0 and plan["fits"] and plan["mesh"] == {"data": 1, "fsdp": 4, "tensor": 1}
  sharded = _matmul_params() + V * D          # every matrix, split over fsdp = 4
  norms = (2 * L + 1) * D                      # RMSNorm scales: replicated
  params = 4 * (sharded / 4 + norms)           # float32
  assert abs(plan["state_bytes"]["params"] - params) / params < 0.10
  assert abs(plan["state_bytes"]["optimizer"] - 2 * params) / (2 * params) < 0.10
  update = {p["name"]: p for p in plan["programs"]}["update"]
  # the compiler's arguments: parameters + Adam's two moments (+ a minibatch of kilobytes)
  assert abs(update["per_chip_bytes"]["arguments"] - 3 * params) / (3 * params) < 0.10


def test_update_flops_match_6nt_plus_attention(planned):
  _, plan = planned
  s = plan["shapes"]
  context = s["prompt_len"] + s["response_len"]
  tokens = s["minibatch"] * context
  # PaLM (arXiv:2204.02311, App. B): 6N per token, plus 12·L·H·Dh·S for attention
  want = tokens * (6 * _matmul_params() + 12 * L * H * DH * context) / plan["chips"]
  update = {p["name"]: p for p in plan["programs"]}["update"]
  assert abs(update["flops"] - want) / want < 0.15, (update["flops"], want)
  assert 0 < plan["iteration"]["update_mfu"] <= 1


def test_auto_attention_is_splash_on_a_tpu_slice(planned):
  # the programs are traced under the mesh: model.attention="auto" picks the Pallas kernel
  _, plan = planned
  kernels = {p["name"]: p["kernels"] for p in plan["programs"]}
  for name in ("prefill", "logprobs", "update"):
    assert any(k.startswith("splash_mha_fwd") for k in kernels[name]), (name, kernels)
  assert any(k.startswith("splash_mha_dkv") for k in kernels["update"])
  assert kernels["update"]["splash_mha_dkv_segmented_no_residuals"] == L  # once per layer
  assert not kernels["decode"]   # decode attends one query to the cache in XLA


def test_json_has_the_stable_fields(planned):
  _, plan = planned
  assert {"topology", "chips", "mesh", "fits", "programs", "iteration"} <= set(plan)
  assert plan["chips"] == 4 and set(plan["mesh"]) == {"data", "fsdp", "tensor"}
  names = [p["name"] for p in plan["programs"]]
  assert names == ["prefill", "decode", "logprobs", "update"]
  for p in plan["programs"]:
    assert {"name", "fits", "compile_s", "flops", "bytes_accessed", "per_chip_bytes",
            "hbm_bytes", "collectives", "roofline_s"} <= set(p)
    assert {"arguments", "outputs", "temporaries", "total"} <= set(p["per_chip_bytes"])
    assert p["flops"] > 0 and p["bytes_accessed"] > 0 and p["roofline_s"] > 0
    assert p["hbm_bytes"] in (16e9, 95e9)
    for kind, c in p["collectives"].items():
      assert kind in ("all-gather", "all-reduce", "reduce-scatter", "all-to-all",
                      "collective-permute") and c["count"] >= 1 and c["bytes"] > 0
  # fsdp = 4: the update gathers the parameters and reduce-scatters (or reduces) gradients
  update = plan["programs"][-1]["collectives"]
  assert "all-gather" in update and ({"reduce-scatter", "all-reduce"} & set(update))
  assert {"roofline_s", "update_mfu"} <= set(plan["iteration"])


def test_a_run_that_cannot_fit_exits_3_with_what_would_fit():
  # 8,192-token responses, no remat, whole micro-batches, the XLA attention: its
  # [B, H, S, S] scores in the forwards and the update exceed a v5e chip's 16 GB (the
  # compiler gives up early: seconds). --search 0 ranks the changes without compiling them.
  code, out = _plan("v5e:2x2", "--search", "0", **{"sampling.max_new_tokens": 8192,
                                                    "model.max_position_embeddings": 16384,
                                                    "algo.minibatches": 1,
                                                    "model.attention": "xla"})
  assert code == 3, out
  assert "update does not fit" in out and "RESOURCE_EXHAUSTED" in out
  assert "(whole mesh, before sharding)" in out   # its largest arrays, named
  # the smallest change estimated to fit: a memory-linear attention (splash on TPU)
  assert "- suggestion: --config.model.attention=auto" in out and "not compiled" in out
  result = json.loads(out.splitlines()[-1].removeprefix("RESULT "))
  assert result["fits"] is False and result["largest_per_chip_gb"] > 16
