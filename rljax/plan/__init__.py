"""`rljax plan`: will a run fit a TPU slice, and what will an iteration cost, before anyone
rents one.

Every program one RL iteration runs (the update step, the old/reference log-prob forward,
the critic's and the teacher's forwards, the sampler's prefill and decode step) is built by
the trainer's own code from the run's config, lowered with abstract parameters (no
weights) and compiled by the TPU compiler for the slice's compile-only devices
(`jax.experimental.topologies`, libtpu). What the compiler reports becomes the plan:

    {"topology", "chips", "mesh": {"data", "fsdp", "tensor"} (and "expert" with
                                    parallel.expert > 1), "fits",
     "programs": [{"name", "fits", "compile_s",
                   "flops", "bytes_accessed" (per chip, per call, every loop counted by its
                                              trip count: `rljax.plan.cost`),
                   "per_chip_bytes": {"arguments", "outputs", "temporaries", "aliases",
                                      "generated_code", "resident", "total"},
                   "hbm_bytes", "collectives": {KIND: {"count", "bytes"}}, "roofline_s",
                   "largest_buffers", "loops", "calls", ...}],
     "iteration": {"roofline_s", "generation_s", "forwards_s", "update_s", "update_mfu",
                   "update_flops_counted"},
     "state_bytes", "routes_bytes" (a MoE policy's recorded routes per chip, else None),
     "model", "shapes", "chip", "notes", "search" (when something does not fit)}

Program names: prefill, decode, logprobs, values, teacher, update, and `routing` for a
mixture-of-experts policy (its rollout's forward with its own and the sampler's experts).

docs/scale.md says how to read it and what the estimate leaves out.
"""

from rljax.plan.planner import Target, plan
from rljax.plan.report import result_line, text
from rljax.plan.topology import (
  CHIPS,
  INSTALL_HINT,
  LibtpuMissing,
  Topology,
  TopologyError,
  libtpu_installed,
  parse_topology,
)

__all__ = ["CHIPS", "INSTALL_HINT", "LibtpuMissing", "Target", "Topology", "TopologyError",
           "libtpu_installed", "parse_topology", "plan", "result_line", "text"]
