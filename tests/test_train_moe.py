"""A mixture-of-experts policy in the trainer: routing replay (the trainer's log-probs of a
rollout equal the sampler's), the flip-rate metric against an independent count, the
load-balancing terms' gradient, the config checks, and an iteration's metrics."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tolerances import assert_close_f32
from train_micro import micro_config, read_records

from rljax.models import Decoder
from rljax.models.testing import perturb_params, tiny_moe_config
from rljax.sampling import SamplingParams, generate
from rljax.train.config import ConfigError
from rljax.train.config.specs import loss_spec
from rljax.train.update import objective, routing
from rljax.train.update.forward import routed_forward

MOE = {"model.num_experts": 4, "model.num_experts_per_tok": 2,
       "model.moe_intermediate_size": 32, "model.num_layers": 2}


@pytest.fixture(scope="module")
def model():
  return perturb_params(Decoder(tiny_moe_config(num_layers=3), rngs=nnx.Rngs(0)), scale=0.3)


def _rollout(model, sampler_dtype=None, seed=0):
  rng = np.random.default_rng(seed)
  lengths = np.array([6, 3, 5, 2])
  mask = (np.arange(6)[None] >= 6 - lengths[:, None]).astype(np.int32)
  tokens = (rng.integers(3, 97, (4, 6)) * mask).astype(np.int32)
  out = generate(model, tokens, mask, sampling=SamplingParams(max_new_tokens=10, n=2),
                 rng=jax.random.key(seed), sampler_dtype=sampler_dtype)
  batch = {"prompt_tokens": out.prompt_tokens, "prompt_mask": out.prompt_mask,
           "tokens": out.tokens, "mask": out.mask, "routes": out.routes}
  return out, batch


def test_with_replay_the_trainers_logprobs_are_the_samplers(model):
  """float32 on one device: the replayed forward gives the sampler's log-probs up to the
  rounding of two programs (cached decode vs full forward), and so does the own routing,
  since no route flips at this precision."""
  out, batch = _rollout(model)
  m = np.asarray(out.mask) > 0
  for replay in (True, False):
    logp, _ = objective.policy_forward(model, batch, temperature=1.0, replay=replay)
    assert_close_f32(np.asarray(logp)[m], np.asarray(out.logp)[m], ulps=256)
  stats = routed_forward(model, batch, temperature=1.0)["stats"]
  assert float(jnp.sum(stats["flips"])) == 0 and float(jnp.sum(stats["pairs"])) > 100


def _own_ids(model, batch):
  seq, positions, attention = objective.full_sequence(batch)
  _, r = model.routed(seq, positions=positions, attention_mask=attention)
  return np.asarray(r.own_ids).transpose(1, 2, 0, 3)   # [B, S, L, k]


def test_a_bf16_sampler_flips_routes_and_the_metric_counts_them(model):
  out, batch = _rollout(model, sampler_dtype="bfloat16", seed=1)
  res = routed_forward(model, batch, temperature=1.0)
  own, sampled = _own_ids(model, batch), np.asarray(out.routes).astype(np.int64)
  real = np.concatenate([np.asarray(out.prompt_mask), np.asarray(out.mask)], 1) > 0
  recorded = (sampled < 4).all(-1) & real[..., None]   # [B, S, L]
  differ = np.sort(own, -1) != np.sort(sampled, -1)
  flips = (differ.any(-1) & recorded).sum()
  assert flips > 0   # bf16 rounding moved some tokens to other experts
  np.testing.assert_allclose(np.asarray(res["stats"]["flips"]).sum(), flips)
  np.testing.assert_allclose(np.asarray(res["stats"]["pairs"]).sum(), recorded.sum())
  metrics = routing.routing_metrics(res["stats"], res["replay"][0], res["own"][0],
                                    out.logp, out.mask)
  assert metrics["moe/routing_flip_rate"] == pytest.approx(flips / recorded.sum(), rel=1e-6)
  load = np.zeros((own.shape[2], 4))
  for layer in range(own.shape[2]):
    np.add.at(load[layer], own[:, :, layer][real], 1.0)
  assert metrics["moe/expert_load_max"] == pytest.approx(load.max() / real.sum(), rel=1e-6)
  # replaying the sampler's experts removes the gap the flips opened
  assert metrics["mismatch/logp_gap_max_replay"] < metrics["mismatch/logp_gap_max_no_replay"]


def test_balancing_terms_reach_the_router(tmp_path):
  """The aux and z-loss gradients: every router's, never the last MoE layer's experts (its
  output feeds no router)."""
  model = perturb_params(Decoder(tiny_moe_config(num_layers=3), rngs=nnx.Rngs(1)), scale=0.3)
  _, batch = _rollout(model)
  b, t = batch["tokens"].shape
  batch.update(old_logp=jnp.zeros((b, t)), advantages=jnp.ones((b,)),
               token_weights=jnp.ones((b, t)), is_weights=jnp.ones((b, t)),
               rng=jax.random.key_data(jax.random.split(jax.random.key(0), b)))
  graphdef, params = nnx.split(model)

  def grads(**coefs):
    config = micro_config("grpo", tmp_path, **MOE, **{f"algo.{k}": v for k, v in coefs.items()})
    spec = loss_spec(config)
    denom = objective.denominators(spec, batch["mask"])
    loss = lambda p: objective.micro_loss(spec, nnx.merge(graphdef, p), None, batch, denom)[0]
    return jax.grad(loss)(params)
  base = grads()
  for coefs in ({"moe_aux_loss_coef": 0.1}, {"moe_z_loss_coef": 0.1}):
    diff = jax.tree.map(lambda a, c: np.abs(np.asarray(a - c)), grads(**coefs), base)
    moe = diff["layers"][1]["layer"]["mlp"]   # layers 1, 2: one scanned MoE stack
    assert (moe["router"][...].max(axis=(1, 2)) > 0).all()
    assert moe["gate"][...][-1].max() == 0 and moe["down"][...][-1].max() == 0


@pytest.mark.parametrize("overrides,field", [
    ({"algo.routing_replay": "always"}, "algo.routing_replay='always'"),
    ({"algo.routing_replay": "sampler"}, "algo.routing_replay='sampler' needs a mixture"),
    ({"algo.moe_z_loss_coef": 0.1}, "algo.moe_z_loss_coef=0.1 needs a mixture"),
    ({**MOE, "algo.routing_replay": "sampler", "algo.pack_sequences": True},
     "algo.pack_sequences=False"),
    ({**MOE, "model.num_experts_per_tok": 5}, "model.num_experts_per_tok=5"),
    ({"sampling.sampler_dtype": "bfloat16", "model.lora_rank": 4}, "model.lora_rank"),
])
def test_config_errors_name_the_field(tmp_path, overrides, field):
  with pytest.raises(ConfigError, match=field.replace("(", r"\(").replace(")", r"\)")):
    micro_config("grpo", tmp_path, **overrides)


@pytest.mark.parametrize("replay", ["none", "sampler"])
def test_an_iteration_logs_the_routing_metrics(tmp_path, replay):
  from rljax.train.loop import train
  config = micro_config("grpo", tmp_path, **MOE, **{
      "run.iterations": 1, "algo.routing_replay": replay, "sampling.sampler_dtype": "bfloat16",
      "algo.moe_aux_loss_coef": 0.01})
  train(config)
  (record,) = read_records(tmp_path / "grpo")
  assert 0 <= record["moe/routing_flip_rate"] < 0.5
  assert 0.5 <= record["moe/expert_load_max"] <= 1   # k / E = 1/2 at balance
  assert 0 < record["update/moe_aux_loss"] < 4   # N·Σ f·P: 1 at a uniform routing, <= N
  own = record["mismatch/logp_gap_mean_" + ("replay" if replay == "sampler" else "no_replay")]
  assert record["mismatch/logp_gap_mean"] == own


def test_sampling_sampler_dtype_is_real(tmp_path):
  """A dense policy sampled by its bf16 copy: the trainer's float32 log-probs keep a gap
  that float32 sampling does not have (rounding only)."""
  from rljax.train.loop import train
  gaps = {}
  for dtype in ("", "bfloat16"):
    train(micro_config("grpo", tmp_path / (dtype or "f32"), **{
        "run.iterations": 1, "sampling.sampler_dtype": dtype}))
    (record,) = read_records(tmp_path / (dtype or "f32") / "grpo")
    gaps[dtype] = record["mismatch/logp_gap_mean"]
    assert "moe/routing_flip_rate" not in record   # a dense policy: no routing metrics
  assert gaps[""] < 1e-5 and gaps["bfloat16"] > 1e-4   # bf16: 2.7e-4 measured
