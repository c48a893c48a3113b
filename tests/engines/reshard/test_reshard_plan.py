"""The gather plans and formulas of the three methods, without processes.

Each rank's plan is executed on synthetic tensors (chunks cut from a full tensor as FSDP
or FSDP x TP would hold them) and the result is compared with the slice the generation
engine wants; the bytes the plan moves are compared with the closed-form formulas.
"""

from __future__ import annotations

import pytest
import torch

from hybridflow.engines.reshard import (
    GenerationGrouping,
    ModelSizes,
    ReshardMethod,
    generation_shard_dim,
    plan_for_rank,
    predicted_costs,
)
from hybridflow.engines.rollout import shard_for_rank

from reshard_layouts import fsdp_layout, llama_shapes, local_chunk

SHAPES = llama_shapes()
# (world, train tp, generation tp): tp=1 at N = 2, 4, 8 with every t_g that divides N up
# to 4, and FSDP x TP layouts with t_g dividing the training tp.
SETTINGS = [(n, 1, tg) for n in (2, 4, 8) for tg in (1, 2, 4) if tg <= n] + [
    (4, 2, 1), (4, 2, 2), (8, 2, 2), (8, 4, 2), (8, 4, 4),
]
METHODS = list(ReshardMethod)


def _fulls(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {name: torch.randn(shape, generator=g) for name, shape in SHAPES}


def _simulate(layout, grouping, rank: int, fulls: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], int]:
    """Run rank's plan on chunks cut from `fulls`: (result per name, bytes received)."""
    by_name = layout.by_name()
    results, received = {}, 0
    for spec in plan_for_rank(layout, grouping, rank):
        p = by_name[spec.name]
        pieces = [None] * spec.group_size
        for member, pos in zip(spec.members, spec.positions):
            pieces[pos] = local_chunk(fulls[spec.name], p, member)
        results[spec.name] = pieces[0] if spec.dim is None else torch.cat(pieces, dim=spec.dim)
        assert tuple(results[spec.name].shape) == spec.shape
        received += (spec.group_size - 1) * pieces[0].numel() * 4
    return results, received


@pytest.mark.parametrize("world,train_tp,gen_tp", SETTINGS)
@pytest.mark.parametrize("method", METHODS)
def test_plan_yields_generation_shards_and_formula_bytes(world, train_tp, gen_tp, method):
    layout = fsdp_layout(SHAPES, world // train_tp, train_tp)
    grouping = GenerationGrouping.build(layout, gen_tp, method)
    fulls = _fulls()
    expected = predicted_costs(ModelSizes.from_shapes(SHAPES), method, world_size=world, train_tp=train_tp,
                               gen_tp=gen_tp, gen_bytes=4, train_bytes=4)
    for rank in range(world):
        results, received = _simulate(layout, grouping, rank, fulls)
        assert received == expected.comm_bytes, (rank, received, expected)
        specs = plan_for_rank(layout, grouping, rank)
        assert [s.name for s in specs] == [n for n, _ in SHAPES]
        for spec in specs:
            got, full = results[spec.name], fulls[spec.name]
            want = shard_for_rank(full, spec.name, grouping.gen_rank[rank], gen_tp)
            if spec.is_gen_shard:
                assert torch.equal(got, want), (rank, spec)
            else:  # a whole tensor, which the generation engine cuts
                assert torch.equal(got, full), (rank, spec)


@pytest.mark.parametrize("world,gen_tp", [(2, 2), (4, 2), (8, 2), (8, 4)])
def test_hybrid_grouping_is_the_papers(world, gen_tp):
    """tp=1: micro-DP groups are blocks of N/t_g consecutive ranks, generation TP groups take
    ranks at stride N/t_g, and every rank's training shard is inside its generation shard."""
    layout = fsdp_layout(SHAPES, world)
    grouping = GenerationGrouping.build(layout, gen_tp, "hybrid")
    block = world // gen_tp
    assert grouping.tp_groups == tuple(tuple(range(j, world, block)) for j in range(block))
    for rank in range(world):
        first = rank // block * block
        for spec in plan_for_rank(layout, grouping, rank):
            if generation_shard_dim(spec.name) is None:  # norms: gathered whole over all ranks
                assert spec.members == tuple(range(world))
                continue
            assert spec.members == tuple(range(first, first + block))
            # the rank's own chunk sits at its place in the block: inside its generation shard
            assert spec.positions[spec.members.index(rank)] == rank - first


@pytest.mark.parametrize("method", ["plain", "gather_all"])
def test_baselines_group_consecutive_ranks_and_gather_everything(method):
    layout = fsdp_layout(SHAPES, 8)
    grouping = GenerationGrouping.build(layout, 2, method)
    assert grouping.tp_groups == ((0, 1), (2, 3), (4, 5), (6, 7))
    for spec in plan_for_rank(layout, grouping, 3):
        assert spec.members == tuple(range(8))


def test_hybrid_needs_aligned_training_shards():
    layout = fsdp_layout(SHAPES, 4, aligned=False)  # FSDP's default dim 0 for o_proj/down_proj
    with pytest.raises(ValueError, match="o_proj.*aligned_shard_dim"):
        GenerationGrouping.build(layout, 2, "hybrid")
    # the baselines gather whole tensors and accept any one-dim sharding
    GenerationGrouping.build(layout, 2, "gather_all")


def test_hybrid_rejects_generation_tp_beyond_training_tp_order():
    layout = fsdp_layout(SHAPES, 2, 2)  # dp 2 x tp 2: chunk order 0, 2, 1, 3 over ranks
    with pytest.raises(ValueError, match="divides the training tp_size"):
        GenerationGrouping.build(layout, 4, "hybrid")


def test_bad_generation_tp_and_method_are_explained():
    layout = fsdp_layout(SHAPES, 4)
    with pytest.raises(ValueError, match="divide the 4 training ranks"):
        GenerationGrouping.build(layout, 3, "hybrid")
    with pytest.raises(ValueError, match="unknown reshard method"):
        GenerationGrouping.build(layout, 2, "scatter")


def test_formula_matches_paper_table_2_when_tp_is_one():
    """With N ranks as the paper's t (p = d = 1) and no replicated parameters, the hybrid
    row is the paper's (t - t_g) / (t_g t) M and the baselines' is (t - 1) / t M."""
    sizes = ModelSizes(split_numel=4096, replicated_numel=0, largest_split_numel=1024, largest_replicated_numel=0)
    for n, tg in [(4, 2), (8, 2), (8, 4)]:
        m = 2 * 4096
        hyb = predicted_costs(sizes, "hybrid", world_size=n, train_tp=1, gen_tp=tg, gen_bytes=2, train_bytes=4)
        base = predicted_costs(sizes, "plain", world_size=n, train_tp=1, gen_tp=tg, gen_bytes=2, train_bytes=4)
        assert hyb.comm_bytes * tg * n == (n - tg) * m
        assert base.comm_bytes * n == (n - 1) * m
        assert hyb.generation_bytes == m // tg and base.buffer_bytes == m


# (pp, dp, tp, generation tp): two stages with FSDP and FSDP x TP inside, every t_g that
# divides a stage's ranks (and the training tp when tp > 1).
PIPELINE_SETTINGS = [(2, 1, 1, 1), (2, 2, 1, 1), (2, 2, 1, 2), (2, 4, 1, 2), (2, 4, 1, 4), (2, 1, 2, 2),
                     (2, 2, 2, 1), (2, 2, 2, 2), (4, 2, 1, 2)]


@pytest.mark.parametrize("pp,dp,tp,gen_tp", PIPELINE_SETTINGS)
@pytest.mark.parametrize("method", METHODS)
def test_pipeline_plan_yields_generation_shards_and_formula_bytes(pp, dp, tp, gen_tp, method):
    """p > 1 -> p_g = 1: each rank ends with its generation shard of every stage's
    parameters (gathered in their stage, broadcast over the pipeline group) and receives
    exactly the formula's bytes for its own stage."""
    from reshard_layouts import pipeline_layout, stage_of_name

    world, layers = pp * dp * tp, 4
    shapes = llama_shapes(layers=layers)
    layout = pipeline_layout(shapes, pp, dp, tp, num_layers=layers)
    grouping = GenerationGrouping.build(layout, gen_tp, method)
    assert all(len({layout.stage_of(r) for r in g}) == 1 for g in grouping.tp_groups)  # groups inside a stage
    assert len(grouping.tp_groups) == world // gen_tp  # d_g = p t d / t_g
    g = torch.Generator().manual_seed(0)
    fulls = {name: torch.randn(shape, generator=g) for name, shape in shapes}
    by_name = layout.by_name()
    for rank in range(world):
        stage = layout.stage_of(rank)
        expected = predicted_costs(
            ModelSizes.from_shapes(shapes), method, world_size=world, train_tp=tp, gen_tp=gen_tp, gen_bytes=4,
            train_bytes=4, pp_size=pp,
            stage=ModelSizes.from_shapes([(n, s) for n, s in shapes if stage_of_name(n, layers, pp) == stage]))
        received = 0
        for spec in plan_for_rank(layout, grouping, rank):
            p = by_name[spec.name]
            pieces = [None] * spec.group_size
            for member, pos in zip(spec.members, spec.positions):
                pieces[pos] = local_chunk(fulls[spec.name], p, layout.local_rank(member))
            got = pieces[0] if spec.dim is None else torch.cat(pieces, dim=spec.dim)
            if rank in spec.members:
                received += (spec.group_size - 1) * pieces[0].numel() * 4
            else:  # another stage's parameter: broadcast by the counterpart at our position
                assert spec.source == layout.global_rank(p.stage, layout.local_rank(rank)) and rank in spec.pipe_group
                assert grouping.gen_rank[spec.source] == grouping.gen_rank[rank]
                received += got.numel() * 4
            want = shard_for_rank(fulls[spec.name], spec.name, grouping.gen_rank[rank], gen_tp)
            assert torch.equal(got, want if spec.is_gen_shard else fulls[spec.name]), (rank, spec.name)
        assert received == expected.comm_bytes, (rank, received, expected)


def test_pipeline_hybrid_grouping_takes_ranks_at_stride_inside_each_stage():
    """p 2 x d 4, t_g 2: in each stage of 4 ranks, generation groups at stride 2, micro-DP
    groups of 2 consecutive ranks holding their common shard; d_g = 8 / 2 = 4 replicas."""
    from reshard_layouts import pipeline_layout

    layout = pipeline_layout(llama_shapes(layers=4), 2, 4, num_layers=4)
    grouping = GenerationGrouping.build(layout, 2, "hybrid")
    assert grouping.tp_groups == ((0, 2), (1, 3), (4, 6), (5, 7))
    for rank in range(8):
        for spec in plan_for_rank(layout, grouping, rank):
            if rank in spec.members and generation_shard_dim(spec.name) is not None:
                first = layout.local_rank(rank) // 2 * 2
                assert spec.members == tuple(layout.global_rank(layout.stage_of(rank), i) for i in (first, first + 1))
                assert spec.positions[spec.members.index(rank)] == layout.local_rank(rank) - first
            assert spec.pipe_group == (rank % 4, rank % 4 + 4)


def test_pipeline_generation_tp_must_divide_a_stage():
    from reshard_layouts import pipeline_layout

    layout = pipeline_layout(llama_shapes(layers=4), 2, 1, num_layers=4)
    with pytest.raises(ValueError, match="divide the 1 ranks of each of the 2 pipeline stages"):
        GenerationGrouping.build(layout, 2, "hybrid")


def test_formula_pipeline_with_equal_stages_is_the_papers():
    """Equal stages, no replicated parameters: the hybrid row is (N - t_g) / (N t_g) M, the
    paper's (tp - t_g p_g) / (t_g p_g tp) M with p_g = 1 and t d in place of t."""
    stage = ModelSizes(split_numel=2048, replicated_numel=0, largest_split_numel=512, largest_replicated_numel=0)
    whole = ModelSizes(split_numel=4096, replicated_numel=0, largest_split_numel=512, largest_replicated_numel=0)
    for n, tg in [(4, 1), (4, 2), (8, 2), (8, 4)]:
        m = 2 * 4096
        hyb = predicted_costs(whole, "hybrid", world_size=n, train_tp=1, gen_tp=tg, gen_bytes=2, train_bytes=4,
                              pp_size=2, stage=stage)
        base = predicted_costs(whole, "gather_all", world_size=n, train_tp=1, gen_tp=tg, gen_bytes=2,
                               train_bytes=4, pp_size=2, stage=stage)
        assert hyb.comm_bytes * tg * n == (n - tg) * m
        assert base.comm_bytes * n == (n - 1) * m and base.buffer_bytes == m
        assert hyb.buffer_bytes == 2 * 512 // tg


def test_layout_reads_pipeline_stages_off_the_ranks_parameters():
    """Ranks with the same names form a stage; chunks are indexed inside the stage. Sets that
    are not equal blocks of consecutive ranks with disjoint names are refused."""
    from hybridflow.engines.reshard import TrainingLayout

    def rank(names: list[str], dim_offset_len: tuple[int, int, int]) -> list[tuple]:
        return [(n, (8, 4), torch.float32, "(Shard(dim=0),)", dim_offset_len) for n in names]

    a, b = ["model.layers.0.mlp.up_proj.weight"], ["model.layers.1.mlp.up_proj.weight"]
    layout = TrainingLayout.from_rank_pieces([rank(a, (0, 0, 4)), rank(a, (0, 4, 4)),
                                              rank(b, (0, 4, 4)), rank(b, (0, 0, 4))])
    assert (layout.num_stages, layout.stage_size) == (2, 2)
    assert [(p.name, p.stage, p.chunks) for p in layout.params] == [(a[0], 0, (0, 1)), (b[0], 1, (1, 0))]
    for bad in ([rank(a, (0, 0, 4)), rank(b, (0, 0, 8)), rank(a, (0, 4, 4))],  # not consecutive
                [rank(a + b, (0, 0, 8)), rank(b, (0, 0, 8))]):  # overlapping names
        with pytest.raises(ValueError, match="neither one model nor pipeline stages"):
            TrainingLayout.from_rank_pieces(bad)
