"""3D-HybridEngine: reshard the actor from its training layout to its generation layout.

    from hybridflow.engines.reshard import HybridEngine, aligned_shard_dim

The actor trains with FSDP2 (x TP) over N ranks and generates with t_g-way tensor
parallelism. With the HybridFlow grouping (`method="hybrid"`, paper section 5) each
rank's training shard lies inside its generation shard, so the only all-gather runs in
micro-DP groups of N / t_g ranks, all at once. The baselines `"plain"` (HybridFlow-V)
and `"gather_all"` (DeepSpeed-Chat-like) gather the whole model instead. The math and the
measurements are in docs/reshard.md; benchmarks/engines/bench_reshard.py measures them.

- placement.py: FSDP shard dims aligned with the generation TP split (`aligned_shard_dim`).
- layout.py: which chunk of every parameter each training rank holds (`TrainingLayout`).
- grouping.py: generation groups and per-parameter gather plans of the three methods.
- accounting.py: byte-exact communication and parameter-memory counting.
- formulas.py: the adapted Table 2, closed form (`predicted_costs`).
- engine.py: `HybridEngine` (`to_generation` / `to_training`).
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
