"""Reading optimized HLO text and the TPU compiler's out-of-memory reports (hand-written
modules in the compiler's text format; nothing is compiled)."""

import jax
import jax.numpy as jnp
import pytest

from rljax.plan import hlo

# An entry computation with a synchronous all-gather, a 4-step scan (its trip count only in
# its condition, as the TPU compiler prints it) whose body holds an all-reduce and an
# async all-gather inside a fusion, and the compiler's reduce-scatter (an all-reduce in a
# computation named all-reduce-scatter).
MODULE = """HloModule jit_step

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %sum = f32[] add(%x, %y)
}

%fused_computation.3 (param_0: bf16[2,64]) -> bf16[8,64] {
  %param_0 = bf16[2,64]{1,0} parameter(0)
  ROOT %all-gather.7 = bf16[8,64]{1,0:T(8,128)(2,1)} all-gather(%param_0), dimensions={0}
}

%all-reduce-scatter.1 (input: f32[16,128]) -> f32[4,128] {
  %input = f32[16,128]{1,0} parameter(0)
  %all-reduce.9 = f32[16,128]{1,0} all-reduce(%input), to_apply=%add
  ROOT %slice = f32[4,128]{1,0} slice(%all-reduce.9), slice={[0:4], [0:128]}
}

%body (p: (s32[], f32[256,1024])) -> (s32[], f32[256,1024]) {
  %p = (s32[], f32[256,1024]) parameter(0)
  %w = f32[256,1024]{1,0} get-tuple-element(%p), index=1
  %all-reduce.2 = f32[256,1024]{1,0} all-reduce(%w), to_apply=%add, metadata={op_name="jit(step)/while/body/psum"}
  %fusion.3 = (bf16[2,64], bf16[8,64]) fusion(%x), kind=kCustom, calls=%fused_computation.3
  ROOT %t = (s32[], f32[256,1024]) tuple(%i, %all-reduce.2)
}

%cond (p: (s32[], f32[256,1024])) -> pred[] {
  %constant.5 = s32[]{:T(128)} constant(4)
  %p = (s32[], f32[256,1024]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  ROOT %lt.1 = pred[]{:T(512)} compare(%i, %constant.5), direction=LT
}

ENTRY %main (a: f32[512,64]) -> f32[2048,64] {
  %a = f32[512,64]{1,0} parameter(0)
  %all-gather.1 = f32[2048,64]{1,0} all-gather(%a), dimensions={0}, metadata={op_name="jit(step)/dot_general"}
  %big = f32[4096,4096]{1,0} multiply(%b, %b), metadata={op_name="jit(step)/attention/scores"}
  %while.1 = (s32[], f32[256,1024]) while(%t0), condition=%cond, body=%body
  %rs = f32[4,128]{1,0} fusion(%y), kind=kCustom, calls=%all-reduce-scatter.1
  ROOT %out = f32[2048,64]{1,0} copy(%all-gather.1)
}
"""


def test_collectives_count_loop_iterations_and_whole_arrays():
  c = hlo.collectives(MODULE)
  # one all-gather in the entry (2048x64 f32 = 512 KiB) + 4 loop steps of an async one
  # (8x64 bf16 = 1 KiB each)
  assert c["all-gather"] == {"count": 5, "bytes": 2048 * 64 * 4 + 4 * 8 * 64 * 2}
  assert c["all-reduce"] == {"count": 4, "bytes": 4 * 256 * 1024 * 4}
  assert c["reduce-scatter"] == {"count": 1, "bytes": 16 * 128 * 4}


def test_largest_buffers_skip_fusion_internals_and_name_the_op():
  top = hlo.largest_buffers(MODULE, 2)
  assert top[0] == {"bytes": 4096 * 4096 * 4, "shape": "f32[4096,4096]",
                    "op": "jit(step)/attention/scores"}
  assert top[1]["op"] == "jit(step)/while/body/psum"


@pytest.mark.parametrize("message,required,available,allocations", [
    ("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO "
     "temporaries (21.80G) exceeds available HBM (15.75G).", 21.80, 15.75, 0),
    ("RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space "
     "hbm. Used 63.80G of 30.75G hbm. Exceeded hbm capacity by 33.05G.\n\n  Largest program "
     "allocations in hbm:\n\n  1. Size: 2.00G\n     Operator: op_name=\"jit(f)/attn/dot_general\"\n"
     "     Shape: f32[32,4096,4096]{1,2,0:T(8,128)}\n     ==========================\n\n"
     "  2. Size: 512.00M\n     Operator: op_name=\"jit(f)/mlp\"\n     Shape: bf16[8,4096,8192]\n",
     63.80, 30.75, 2),
])
def test_out_of_memory_reports(message, required, available, allocations):
  oom = hlo.out_of_memory(message)
  assert oom["required"] == pytest.approx(required * 2 ** 30)
  assert oom["available"] == pytest.approx(available * 2 ** 30)
  assert len(oom["allocations"]) == allocations
  if allocations:
    assert oom["allocations"][0] == {"bytes": 2 * 2 ** 30, "shape": "f32[32,4096,4096]{1,2,0:T(8,128)}",
                                     "op": "jit(f)/attn/dot_general"}
    assert oom["allocations"][1]["bytes"] == 512 * 2 ** 20
  assert hlo.out_of_memory("INTERNAL: something else") is None


def test_largest_lowered_names_the_attention_scores():
  def attention(q, k):
    return jax.nn.softmax(jnp.einsum("bqd,bkd->bqk", q, k)) @ k
  x = jax.ShapeDtypeStruct((2, 256, 8), jnp.float32)
  text = jax.jit(attention).lower(x, x).as_text(debug_info=True)
  top = hlo.largest_lowered(text, 1)[0]
  assert top["shape"] == "f32[2,256,256]" and top["bytes"] == 2 * 256 * 256 * 4
  assert top["whole_mesh"] and "jit(attention)" in top["op"]


def test_sparsecore_computations_keep_their_closing_line():
  # v5p offloads scatters to its SparseCore: such a computation closes with its thread
  text = ("HloModule m\n\n%add.sc (a: s32[], b: s32[]) -> s32[] {\n"
          "  %a = s32[] parameter(0)\n  %b = s32[] parameter(1)\n"
          "  ROOT %s = s32[] add(%a, %b)\n}, execution_thread=\"sparsecore\"\n\n"
          "ENTRY %main (x: s32[]) -> s32[] {\n  ROOT %x = s32[] parameter(0)\n}\n")
  comps = hlo.computations(text, headers=True)
  assert comps["add.sc"][1] == ["  %a = s32[] parameter(0)", "  %b = s32[] parameter(1)",
                                "  ROOT %s = s32[] add(%a, %b)"]
  assert comps["add.sc"][3] == '}, execution_thread="sparsecore"' and comps["main"][3] == "}"
  assert hlo.computations(text)["main"] == (True, ["  ROOT %x = s32[] parameter(0)"])
