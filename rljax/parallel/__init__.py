"""The one place that knows about meshes, logical-axis rules and multi-host start-up."""

from rljax.parallel.distributed import initialize_distributed
from rljax.parallel.hostdata import (
    any_process,
    from_local_rows,
    gather,
    is_primary,
    local_rows,
    move,
    to_local_rows,
)
from rljax.parallel.mesh import (
    BATCH_AXES,
    EXPERT_AXIS,
    MESH_AXES,
    batch_sharding,
    batch_shards,
    low_memory_compiler_options,
    make_mesh,
    mesh_axis_sizes,
    replicated_sharding,
    select_devices,
    split_devices,
    traced_on,
)
from rljax.parallel.sharding import (
    LOGICAL_AXIS_RULES,
    assert_sharded,
    logical_to_mesh_spec,
    replicated_fraction,
    shard_model,
    sharding_report,
    state_shardings,
    variable_sharding,
)

__all__ = [
    "BATCH_AXES", "EXPERT_AXIS", "LOGICAL_AXIS_RULES", "MESH_AXES", "assert_sharded", "batch_sharding", "batch_shards",
    "initialize_distributed",
    "logical_to_mesh_spec", "any_process", "from_local_rows", "gather", "is_primary",
    "local_rows", "low_memory_compiler_options", "move", "to_local_rows", "make_mesh", "mesh_axis_sizes", "select_devices", "split_devices", "traced_on", "replicated_fraction", "replicated_sharding",
    "shard_model", "sharding_report", "state_shardings", "variable_sharding",
]
