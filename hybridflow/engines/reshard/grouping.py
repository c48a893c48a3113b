"""Generation groups and the per-parameter gather plan of the three resharding methods.

Pure functions of a `TrainingLayout` (no processes), so every rank computes the same
plan for every other rank and the process groups can be created collectively.

Notation (docs/reshard.md): N training ranks, each holding chunk c(r) of every
TP-split parameter (c(r) = r for FSDP alone, tp_rank * dp + dp_rank for FSDP x TP);
generation tensor parallelism t_g; B = N / t_g.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hybridflow.engines.reshard.layout import ParamLayout, TrainingLayout
from hybridflow.engines.reshard.method import ReshardMethod
from hybridflow.engines.reshard.placement import generation_shard_dim


@dataclass(frozen=True)
class GenerationGrouping:
    """Generation tensor-parallel rank and group of every training rank."""

    method: ReshardMethod
    world_size: int
    tp_size: int
    gen_rank: tuple[int, ...]  # generation TP rank of each global rank
    tp_groups: tuple[tuple[int, ...], ...]  # each sorted; position in the tuple = generation TP rank

    def tp_group_of(self, rank: int) -> tuple[int, ...]:
        return next(g for g in self.tp_groups if rank in g)

    @classmethod
    def build(cls, layout: TrainingLayout, tp_size: int, method: ReshardMethod | str) -> "GenerationGrouping":
        """Every generation group lies inside one pipeline stage: the stage's N / p ranks are
        grouped as a whole world would be without pipelining (p_g = 1)."""
        method = ReshardMethod.parse(method)
        world, size = layout.world_size, layout.stage_size
        if tp_size < 1 or size % tp_size:
            where = (f"the {world} training ranks" if layout.num_stages == 1 else
                     f"the {size} ranks of each of the {layout.num_stages} pipeline stages (t x d)")
            raise ValueError(f"generation tp_size={tp_size} must be >= 1 and divide {where}")
        if method is ReshardMethod.HYBRID:
            chunk = _split_chunk_of_rank(layout, tp_size)
            block = size // tp_size
            gen_rank = tuple(chunk[layout.local_rank(r)] // block for r in range(world))
            groups = [tuple(layout.global_rank(s, i) for i in range(size) if chunk[i] % block == j)
                      for s in range(layout.num_stages) for j in range(block)]
        else:
            gen_rank = tuple(r % tp_size for r in range(world))
            groups = [tuple(range(j * tp_size, (j + 1) * tp_size)) for j in range(world // tp_size)]
        for group in groups:
            # torch orders a process group by global rank, and the generation engine takes
            # its TP rank from that order: the two must agree.
            if [gen_rank[r] for r in group] != list(range(tp_size)):
                raise ValueError(
                    f"generation group {list(group)} would need TP ranks {[gen_rank[r] for r in group]} "
                    f"in rank order; with FSDP x TP training use a generation tp_size that divides the "
                    "training tp_size (or train with tp_size=1)"
                )
        return cls(method, world, tp_size, gen_rank, tuple(groups))


def _split_chunk_of_rank(layout: TrainingLayout, tp_size: int) -> tuple[int, ...]:
    """c(i) of each stage-local rank i for the hybrid grouping; checks every TP-split
    parameter (of every stage: the stages share one mesh) is aligned with it."""
    size, chunk = layout.stage_size, None
    if size == 1:
        return (0,)  # one rank holds every parameter whole (DTensors over one rank are unsplit)
    for p in layout.params:
        gen_dim = generation_shard_dim(p.name)
        if gen_dim is None or p.ragged is not None:
            continue
        if p.dim != gen_dim or p.num_chunks != size:
            raise ValueError(
                f"{p.name}: the hybrid grouping needs its training shards split {size} ways on "
                f"dim {gen_dim} (the generation TP dim), but they are split {p.num_chunks} ways "
                f"on dim {p.dim}. Build the training engine with FSDP placement "
                "hybridflow.engines.reshard.aligned_shard_dim."
            )
        if chunk is None:
            chunk = p.chunks
        elif p.chunks != chunk:
            raise ValueError(
                f"{p.name}: its chunk order over ranks {p.chunks} differs from that of the other "
                f"split parameters {chunk}; the hybrid grouping needs one order for all"
            )
    if chunk is None:
        raise ValueError("the model has no tensor-parallel-split parameters; nothing to group")
    return chunk


@dataclass(frozen=True)
class GatherSpec:
    """One parameter on one rank: gather `members`' chunks along `dim` into `shape`.

    positions[i] is where member i's chunk lands (in chunks along `dim`). `is_gen_shard`:
    the result is already this rank's generation shard; otherwise it is the full tensor
    and the generation engine cuts its piece.

    Pipeline stages: `members` are ranks of the parameter's stage; a rank of another
    stage is not among them and receives the result instead, broadcast by `source` (the
    member at its own position in the stage, which needs the same generation shard)
    over `pipe_group` (one rank per stage, same position). Without stages `source` is None.
    """

    name: str
    dim: int | None
    members: tuple[int, ...]
    positions: tuple[int, ...]
    shape: tuple[int, ...]
    is_gen_shard: bool
    # Ragged parameters: (offset, length) along `dim` of each member's piece; positions
    # are then the members' order and the pieces are padded to the longest for the gather.
    pieces: tuple[tuple[int, int], ...] | None = None
    source: int | None = None
    pipe_group: tuple[int, ...] = ()

    @property
    def group_size(self) -> int:
        return len(self.members)


def plan_for_rank(layout: TrainingLayout, grouping: GenerationGrouping, rank: int) -> list[GatherSpec]:
    """The gathers (and pipeline broadcasts) rank `rank` takes part in, one per parameter,
    in the layout's order (the same on every rank, so the collectives line up)."""
    local = layout.local_rank(rank)
    pipe_group = tuple(layout.global_rank(s, local) for s in range(layout.num_stages))
    plan = []
    for p in layout.params:
        source = layout.global_rank(p.stage, local)  # this rank's counterpart in p's stage
        spec = _spec(p, layout, grouping, source)
        if layout.num_stages > 1:
            spec = replace(spec, source=source, pipe_group=pipe_group)
        plan.append(spec)
    return plan


def all_gather_groups(layout: TrainingLayout, grouping: GenerationGrouping) -> list[tuple[int, ...]]:
    """Every distinct gather (and pipeline broadcast) group of size > 1 over all ranks, in a fixed order."""
    groups = set()
    for rank in range(layout.world_size):
        for spec in plan_for_rank(layout, grouping, rank):
            groups |= {g for g in (spec.members, spec.pipe_group) if len(g) > 1}
    return sorted(groups)


def _spec(p: ParamLayout, layout: TrainingLayout, grouping: GenerationGrouping, rank: int) -> GatherSpec:
    """The gather of `p` that `rank` (a rank of p's stage) takes part in."""
    gen_dim = generation_shard_dim(p.name)
    local = layout.local_rank(rank)

    def to_global(ranks) -> tuple[int, ...]:
        return tuple(layout.global_rank(p.stage, i) for i in ranks)

    if p.dim is None:
        return GatherSpec(p.name, None, (rank,), (0,), p.shape, gen_dim is None or grouping.tp_size == 1)
    size = layout.stage_size
    if p.ragged is not None:
        return GatherSpec(p.name, p.dim, to_global(range(size)), tuple(range(size)), p.shape,
                          gen_dim is None or grouping.tp_size == 1, pieces=p.ragged)
    hybrid = grouping.method is ReshardMethod.HYBRID
    if hybrid and gen_dim is not None:
        per = p.num_chunks // grouping.tp_size
        first = grouping.gen_rank[rank] * per
        needed = range(first, first + per)
    else:
        needed = range(p.num_chunks)
    replica = p.holders(p.chunks[local]).index(local)
    members = tuple(
        i for i in range(size)
        if p.chunks[i] in needed and p.holders(p.chunks[i]).index(i) == replica
    )
    positions = tuple(p.chunks[i] - needed.start for i in members)
    if sorted(positions) != list(range(len(needed))):
        raise ValueError(f"{p.name}: ranks {to_global(members)} do not hold chunks {list(needed)} exactly once")
    shape = list(p.shape)
    shape[p.dim] = p.shape[p.dim] // p.num_chunks * len(needed)
    is_gen_shard = (hybrid and gen_dim is not None) or gen_dim is None or grouping.tp_size == 1
    return GatherSpec(p.name, p.dim, to_global(members), positions, tuple(shape), is_gen_shard)
