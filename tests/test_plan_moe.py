"""`rljax plan` for a mixture-of-experts policy on an `expert` mesh axis (compiled here by
libtpu for a v5p slice, nothing runs): parameter bytes per chip against a count of the
expert-split weights, the collectives that move tokens between expert groups, the
routing-replay route buffers in the sampler's and the trainer's inputs, and the
`qwen3-30b-a3b` preset's sizes against its model card."""

import contextlib
import importlib.util
import io
import json

import jax
import pytest

from rljax.cli import main
from rljax.models import config_from_hf
from rljax.models.presets import hf_config_dict
from rljax.plan.estimate import matmul_params
from rljax.train.config import ConfigError, load_config

needs_libtpu = pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None,
    reason='libtpu (the TPU compiler) is not installed: pip install -e ".[tpu]"')

# widths whose per-chip shards are whole (8, 128) tiles; every layer a MoE layer
D, H, K, DH, V, L = 512, 4, 2, 128, 128, 2
E, TOPK, F = 8, 2, 256
P, T, ROWS = 16, 112, 32
TINY_MOE = {"model.hidden_size": D, "model.intermediate_size": 1024, "model.num_heads": H,
            "model.num_kv_heads": K, "model.head_dim": DH, "model.vocab_size": V,
            "model.num_layers": L, "model.num_experts": E, "model.num_experts_per_tok": TOPK,
            "model.moe_intermediate_size": F, "sampling.prompts_per_iteration": 8,
            "sampling.n": 4, "algo.minibatches": 4, "sampling.max_new_tokens": T,
            "parallel.data": 1, "parallel.fsdp": 2, "parallel.expert": 2,
            "algo.routing_replay": "sampler"}


def _overrides(**extra):
  """TINY_MOE with `extra`, loadable on the test session's 8 host devices (data takes the
  rest: 1 on the 4 chips planned)."""
  return dict(TINY_MOE, **{"parallel.data": -1}, **extra)


@pytest.fixture(scope="module")
def planned():
  argv = ["plan", "--config", "experiments/grpo.py", "--topology", "v5p:2x2x1", "--json"]
  argv += [f"--config.{k}={v}" for k, v in TINY_MOE.items()]
  out = io.StringIO()
  with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as e:
    main(argv)
  return e.value.code, json.loads(out.getvalue())


@needs_libtpu
def test_expert_axis_splits_the_experts_and_their_tokens_move(planned):
  code, plan = planned
  assert code == 0 and plan["fits"]
  assert plan["mesh"] == {"data": 1, "fsdp": 2, "expert": 2, "tensor": 1}
  assert [p["name"] for p in plan["programs"]] == ["prefill", "decode", "routing", "update"]
  # experts [E, D, F] split over expert x fsdp (4 chips); attention, router, embedding and
  # head over fsdp (2); norms (and the router's scores axis) replicated
  attention = L * D * DH * (2 * H + 2 * K)
  experts = L * 3 * E * D * F
  router = L * D * E
  norms = (2 * L + 1) * D
  params = 4 * ((attention + router + 2 * V * D) / 2 + experts / 4 + norms)
  assert abs(plan["state_bytes"]["params"] - params) / params < 0.10
  assert plan["model"]["experts"] == E and plan["model"]["moe_layers"] == L
  # the update moves tokens to and from the expert groups, and gathers fsdp shards
  update = {p["name"]: p for p in plan["programs"]}["update"]["collectives"]
  assert "all-gather" in update and ({"all-to-all", "all-reduce", "reduce-scatter"} & set(update))


@needs_libtpu
def test_route_buffers_are_counted(planned):
  _, plan = planned
  # uint8 ids [rows, P + T, L_moe, k], rows split over the batch axes (fsdp = 2; the expert
  # axis does not split the batch)
  want = ROWS * (P + T) * L * TOPK / 2
  assert plan["routes_bytes"] == {"sampler": want, "rollout": want, "dtype": "uint8"}


@needs_libtpu
def test_replay_puts_the_routes_in_the_update_and_the_decode_carry():
  from rljax.plan import Target
  from rljax.plan.abstract import abstract_run
  from rljax.plan.programs import minibatch
  from rljax.plan.sampler import SamplerPrograms
  target = Target.resolve("v5p:2x2x1")
  for replay in ("sampler", "none"):
    config = load_config("experiments/grpo.py", _overrides(**{"algo.routing_replay": replay}))
    run = abstract_run(config, target.devices, target.topology)
    routes = minibatch(run).get("routes")
    if replay == "sampler":
      assert routes.shape == (ROWS // 4, P + T, L, TOPK) and routes.dtype == jax.numpy.uint8
    else:
      assert routes is None
  carry = SamplerPrograms(run)._carry(ROWS)
  assert carry[3].routes.shape == (ROWS, P + T, L, TOPK)


def test_expert_axis_config_errors_name_the_field():
  with pytest.raises(ConfigError, match="parallel.expert=3 must divide the policy's 8 experts"):
    load_config("experiments/grpo.py", _overrides(**{"parallel.expert": 3}))
  with pytest.raises(ConfigError, match="parallel.expert=2 splits .* this policy is dense"):
    load_config("experiments/grpo.py", _overrides(**{"model.num_experts": 0,
                                                     "algo.routing_replay": "none"}))


def test_qwen3_30b_a3b_preset_matches_the_model_card():
  """30.5 B parameters, 3.3 B activated (Qwen/Qwen3-30B-A3B's model card)."""
  c = config_from_hf(hf_config_dict("qwen3-30b-a3b"))
  assert (c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size) == (128, 8, 768)
  assert c.norm_topk_prob and c.qk_norm and not c.tie_embeddings
  attention = c.hidden_size * c.head_dim * (2 * c.num_heads + 2 * c.num_kv_heads)
  per_layer = (attention + 3 * c.num_experts * c.hidden_size * c.moe_intermediate_size
               + c.hidden_size * c.num_experts + 2 * c.hidden_size + 2 * c.head_dim)
  total = c.num_layers * per_layer + 2 * c.vocab_size * c.hidden_size + c.hidden_size
  assert abs(total / 1e9 - 30.5) / 30.5 < 0.01
  # activated: the matmul parameters a token uses (k of E experts), plus its embedding row
  active = matmul_params(c) + c.vocab_size * c.hidden_size
  assert abs(active / 1e9 - 3.3) / 3.3 < 0.03
