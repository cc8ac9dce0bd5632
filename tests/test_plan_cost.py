"""A program's FLOPs and bytes with its while loops counted by trip count (compiled for
the host's CPU; XLA's own cost analysis counts a loop's body once)."""

import jax
import jax.numpy as jnp
import pytest

from rljax.plan.cost import causal_blocks, loop_counted

M, D, LAYERS, STEPS = 64, 128, 4, 3


def _nested(x, ws, unroll):
  """LAYERS scanned layers, each STEPS scanned matmuls h <- h @ w."""
  def layer(h, w):
    h, _ = jax.lax.scan(lambda h2, _: (h2 @ w, None), h, None, length=STEPS, unroll=unroll)
    return h, None
  return jax.lax.scan(layer, x, ws, unroll=unroll)[0]


def _compiled(fn, *args):
  compiled = jax.jit(fn, static_argnums=len(args) - 1).lower(*args).compile()
  cost = compiled.cost_analysis()
  return (cost[0] if isinstance(cost, list) else cost), compiled.as_text()


def test_nested_scans_count_every_iteration():
  x, ws = jnp.ones((M, D)), jnp.ones((LAYERS, D, D))
  matmuls = LAYERS * STEPS * 2 * M * D * D
  cost, text = _compiled(_nested, x, ws, 1)
  assert cost["flops"] < matmuls / 10   # XLA's own count: one inner body, once
  counted = loop_counted(cost, text)
  # the matmuls, plus a loop counter's add and compare per iteration
  assert matmuls <= counted["flops"] <= matmuls + 100
  trips = sorted((loop["trip"], loop["flops"] // (2 * M * D * D)) for loop in counted["loops"])
  assert trips == [(STEPS, 1), (LAYERS, STEPS)]   # per iteration, nested loops included
  unrolled, _ = _compiled(_nested, x, ws, True)
  assert unrolled["flops"] == matmuls
  assert counted["bytes_accessed"] >= unrolled["bytes accessed"]   # + the carried tuples


def test_gradient_of_a_scan_matches_its_unrolled_program():
  def loss(ws, x, unroll):
    return jnp.tanh(_nested(x, ws, unroll)).sum()
  grad = jax.grad(loss)
  x, ws = jnp.ones((M, D)), jnp.ones((LAYERS, D, D)) / D
  counted = loop_counted(*_compiled(grad, ws, x, 1))
  unrolled, _ = _compiled(grad, ws, x, True)
  # forward + backward: 3 matmuls per step; unrolled, the compiler drops the first step's
  # gradient with respect to the constant input (one matmul of 36)
  matmuls = 3 * LAYERS * STEPS * 2 * M * D * D
  assert abs(counted["flops"] - matmuls) / matmuls < 0.02
  assert abs(unrolled["flops"] - matmuls * 35 / 36) / matmuls < 0.02


def test_a_program_without_loops_keeps_its_cost():
  cost, text = _compiled(lambda a, _: a @ a, jnp.ones((D, D)), None)
  assert loop_counted(cost, text) == {"flops": cost["flops"],
                                      "bytes_accessed": cost["bytes accessed"], "loops": []}


@pytest.mark.parametrize("s,block,pairs", [(128, 128, 1), (1024, 512, 3), (1024, 128, 36),
                                           (256, 512, 1)])
def test_causal_blocks_count_the_lower_triangle(s, block, pairs):
  assert causal_blocks(s, s, block, block) == pairs
  # a key block holds a key at or before some query of a query block
  n = -(-s // min(block, s))
  assert pairs == n * (n + 1) // 2


def test_an_undercounted_update_takes_its_time_from_the_model_flops():
  """MFU at the roofline never reads above 100 %: an update whose compiled FLOPs fall
  below the model count (uncounted loop trips) is timed by the model count."""
  from rljax.models import ModelConfig
  from rljax.plan.estimate import iteration, training_flops_per_token

  cfg = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
                    num_heads=2, num_kv_heads=1, head_dim=16)
  chips, peak, tokens, context = 4, 1e12, 256, 64
  useful = tokens * training_flops_per_token(cfg, context)
  floor = useful / (chips * peak)

  def plan(flops_fraction):
    update = {"name": "update", "compiled": True, "calls": 2, "tokens": tokens,
              "flops": flops_fraction * useful / chips,
              "roofline_s": flops_fraction * useful / chips / peak}
    return iteration([update], model_cfg=cfg, context=context, chips=chips, peak_flops=peak,
                     lora=False)

  short = plan(0.5)
  assert short["update_flops_counted"] == pytest.approx(0.5)
  assert short["update_mfu"] == pytest.approx(1.0) and short["update_s"] == pytest.approx(2 * floor)
  full = plan(1.25)   # more FLOPs than the model count (e.g. recomputation): its own time
  assert full["update_mfu"] == pytest.approx(0.8) and full["update_s"] == pytest.approx(2.5 * floor)
