"""Ragged parameters (a dim the ranks do not divide, issue 17), without processes: the
layout built from every rank's (dim, offset, length), the whole-tensor gather the plan
gives them, and the generation engine's ceil-sized vocabulary pieces."""

from __future__ import annotations

import pytest
import torch

from hybridflow.engines.reshard import GenerationGrouping, ReshardMethod, plan_for_rank
from hybridflow.engines.reshard.layout import ParamLayout, TrainingLayout, _param_layout
from hybridflow.engines.rollout import shard_for_rank
from hybridflow.engines.rollout.weights import tp_piece


def _rows(dim: int, pieces: list[tuple[int, int]]) -> torch.Tensor:
    return torch.tensor([(dim, offset, length) for offset, length in pieces])


def test_uneven_fsdp_pieces_make_a_ragged_layout():
    pieces = [(0, 18), (18, 18), (36, 18), (54, 15)]  # FSDP2: 69 rows over 4 ranks
    p = _param_layout("lm_head.weight", torch.empty(69, 8), _rows(0, pieces))
    assert (p.dim, p.num_chunks, p.chunks, p.ragged) == (0, 4, (0, 1, 2, 3), tuple(pieces))
    strided = [(0, 18), (35, 17), (18, 17), (52, 17)]  # FSDP x TP: 35 | 34, each over dp 2
    p = _param_layout("lm_head.weight", torch.empty(69, 8), _rows(0, strided))
    assert p.chunks == (0, 2, 1, 3) and p.ragged == tuple(strided)
    empty = [(0, 2), (2, 2), (4, 1), (5, 0)]  # 5 rows over 4 ranks: the last holds none
    assert _param_layout("w", torch.empty(5, 8), _rows(0, empty)).ragged == tuple(empty)


def test_equal_pieces_keep_the_chunk_layout():
    p = _param_layout("w", torch.empty(64, 8), _rows(0, [(32, 32), (0, 32), (32, 32), (0, 32)]))
    assert (p.num_chunks, p.chunks, p.ragged) == (2, (1, 0, 1, 0), None)


@pytest.mark.parametrize("pieces, message", [
    ([(0, 18), (17, 18)], "exactly once"),
    ([(0, 18), (18, 18)], "cover 36 of its 69 rows"),
])
def test_pieces_that_do_not_tile_the_dim_are_refused(pieces, message):
    with pytest.raises(ValueError, match=message):
        _param_layout("w", torch.empty(69, 8), _rows(0, pieces))


def test_the_plan_gathers_ragged_parameters_whole_from_every_rank():
    dt = torch.float32
    layout = TrainingLayout((
        ParamLayout("model.layers.0.self_attn.q_proj.weight", (64, 64), 0, 2, (0, 1), dt),
        ParamLayout("lm_head.weight", (69, 64), 0, 2, (0, 1), dt, ragged=((0, 35), (35, 34))),
    ), world_size=2)
    for method in ReshardMethod:
        grouping = GenerationGrouping.build(layout, 2, method)
        lm_head = plan_for_rank(layout, grouping, 1)[1]
        assert (lm_head.members, lm_head.shape, lm_head.pieces) == ((0, 1), (69, 64), ((0, 35), (35, 34)))
        assert not lm_head.is_gen_shard  # the generation engine cuts its own piece
    assert plan_for_rank(layout, GenerationGrouping.build(layout, 1, "hybrid"), 0)[1].is_gen_shard


def test_generation_pieces_of_an_odd_vocabulary():
    assert [tp_piece(69, r, 2) for r in range(2)] == [(0, 35), (35, 34)]
    assert [tp_piece(5, r, 4) for r in range(4)] == [(0, 2), (2, 2), (4, 1), (5, 0)]
    full = torch.arange(69 * 3).reshape(69, 3)
    parts = [shard_for_rank(full, "model.embed_tokens.weight", r, 4) for r in range(4)]
    assert [len(part) for part in parts] == [18, 18, 18, 15] and torch.equal(torch.cat(parts), full)
