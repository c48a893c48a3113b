"""FSDP shard placement aligned with generation tensor parallelism.

For the HybridFlow grouping to move only 1/t_g of the model, each training rank's FSDP
shard of a parameter must be a contiguous piece of the generation tensor-parallel shard
that the same rank needs. The generation engine splits column-parallel weights
(q/k/v/gate/up, embeddings, lm_head) on dim 0 and row-parallel weights (o_proj,
down_proj) on dim 1, so FSDP must shard those on the same dims. FSDP2 shards on dim 0
unless `fully_shard(..., shard_placement_fn=...)` says otherwise; the functions here say
so. Replicated generation weights (norms) keep FSDP's dim 0: they are gathered whole.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn
from torch.distributed.tensor import Shard

from hybridflow.engines.rollout.weights import tp_shard_dim


def generation_shard_dim(name: str) -> int | None:
    """Dim along which the generation engine splits HF parameter `name` (None: replicated)."""
    return tp_shard_dim(name)


def aligned_shard_dim(name: str) -> int:
    """FSDP shard dim for HF parameter `name` so the training shard lies in the generation shard."""
    dim = generation_shard_dim(name)
    return 0 if dim is None else dim


def aligned_placement_fn(names: dict[int, str]) -> Callable[[nn.Parameter], Shard]:
    """A `shard_placement_fn` for `fully_shard`, given {id(parameter): HF name}.

    FSDP2 passes parameter objects, not names, so the caller records the names right
    before `fully_shard` (after tensor parallelism has replaced the parameters).
    """

    def placement(param: nn.Parameter) -> Shard:
        name = names.get(id(param))
        if name is None:
            raise KeyError(
                "aligned_placement_fn got a parameter it has no name for; build the "
                "{id(param): name} map right before fully_shard, after tensor parallelism"
            )
        return Shard(aligned_shard_dim(name))

    return placement
