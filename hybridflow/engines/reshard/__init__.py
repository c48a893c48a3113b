"""3D-HybridEngine: reshard the actor from its training layout to its generation layout.

    from hybridflow.engines.reshard import HybridEngine, aligned_shard_dim

The actor trains with FSDP2 (x TP) over N ranks and generates with t_g-way tensor
parallelism. With the HybridFlow grouping (`method="hybrid"`, paper section 5) each
rank's training shard lies inside its generation shard, so the only all-gather runs in
micro-DP groups of N / t_g ranks, all at once. The baselines `"plain"` (HybridFlow-V)
and `"gather_all"` (DeepSpeed-Chat-like) gather the whole model instead. The math and the
measurements are in docs/reshard.md; benchmarks/bench_reshard.py measures them.

- placement.py: FSDP shard dims aligned with the generation TP split (`aligned_shard_dim`).
- layout.py: which chunk of every parameter each training rank holds (`TrainingLayout`).
- grouping.py: generation groups and per-parameter gather plans of the three methods.
- accounting.py: byte-exact communication and parameter-memory counting.
- formulas.py: the adapted Table 2, closed form (`predicted_costs`).
- engine.py: `HybridEngine` (`to_generation` / `to_training`).
"""

from hybridflow.engines.reshard.accounting import CommMeter, MemoryLedger
from hybridflow.engines.reshard.engine import (
    HybridEngine,
    TransitionStats,
    create_process_groups,
)
from hybridflow.engines.reshard.formulas import Costs, ModelSizes, predicted_costs
from hybridflow.engines.reshard.grouping import (
    GatherSpec,
    GenerationGrouping,
    ReshardMethod,
    all_gather_groups,
    plan_for_rank,
)
from hybridflow.engines.reshard.layout import ParamLayout, TrainingLayout, local_shard
from hybridflow.engines.reshard.placement import aligned_placement_fn, aligned_shard_dim, generation_shard_dim

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
