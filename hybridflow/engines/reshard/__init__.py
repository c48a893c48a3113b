"""3D-HybridEngine: reshard the actor from its training layout to its generation layout.

    from hybridflow.engines.reshard import HybridEngine, aligned_shard_dim
"""

from __future__ import annotations

from hybridflow.lazy import lazy_exports

# name -> the module that defines it; imported on first use (hybridflow/lazy.py), so
# importing a torch-free module of this package (config classes) stays torch-free.
_EXPORTS = {
    "CommMeter": "accounting",
    "MemoryLedger": "accounting",
    "HybridEngine": "engine",
    "TransitionStats": "engine",
    "create_process_groups": "engine",
    "Costs": "formulas",
    "ModelSizes": "formulas",
    "predicted_costs": "formulas",
    "GatherSpec": "grouping",
    "GenerationGrouping": "grouping",
    "ReshardMethod": "grouping",
    "all_gather_groups": "grouping",
    "plan_for_rank": "grouping",
    "ParamLayout": "layout",
    "TrainingLayout": "layout",
    "local_shard": "layout",
    "aligned_placement_fn": "placement",
    "aligned_shard_dim": "placement",
    "generation_shard_dim": "placement",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [
    "CommMeter",
    "Costs",
    "GatherSpec",
    "GenerationGrouping",
    "HybridEngine",
    "MemoryLedger",
    "ModelSizes",
    "ParamLayout",
    "ReshardMethod",
    "TrainingLayout",
    "TransitionStats",
    "aligned_placement_fn",
    "aligned_shard_dim",
    "all_gather_groups",
    "create_process_groups",
    "generation_shard_dim",
    "local_shard",
    "plan_for_rank",
    "predicted_costs",
]
