"""Controller-side dispatch: splits, collects, input checks and `@register` (no workers).

These run the real split/collect functions on real DataProtos; the Ray-backed behaviour
of the same modes is checked end to end in test_controller_worker_group.py.
"""

from __future__ import annotations

import pytest
import torch

from hybridflow.controller import (
    Dispatch,
    DispatchContext,
    DispatchError,
    Execute,
    MeshCoord,
    ResourcePool,
    Worker,
    register,
    register_dispatch_mode,
    registered_methods,
)
from hybridflow.controller.dispatch import check_mesh, collect_dp_proto, select_mesh
from hybridflow.protocol import DataProto


def proto(n: int, width: int = 3) -> DataProto:
    rows = torch.arange(n)
    return DataProto.from_dict(tensors={"input_ids": rows[:, None] * 10 + torch.arange(width)[None, :]},
                               non_tensors={"uid": [f"u{i}" for i in range(n)]}, meta_info={"temperature": 0.7})


def ctx(world_size: int, mode: str = "TEST", mesh: tuple[MeshCoord, ...] | None = None) -> DispatchContext:
    return DispatchContext(label="role.method", mode=mode, world_size=world_size, mesh=mesh)


def first_column(p: DataProto) -> list[int]:
    return (p.batch["input_ids"][:, 0] // 10).tolist()


# --------------------------------------------------------------------- built-in modes

def test_one_to_all_sends_the_same_values_and_collects_a_list():
    mode = Dispatch.ONE_TO_ALL
    split = mode.split(ctx(3), (1, "a"), {"k": [2]})
    assert split.per_rank == [((1, "a"), {"k": [2]})] * 3
    assert mode.collect(ctx(3), ["x", "y", "z"]) == ["x", "y", "z"]


@pytest.mark.parametrize("mode", [Dispatch.ALL_TO_ALL, Dispatch.DP_COMPUTE])
def test_per_rank_modes_give_rank_i_the_ith_values(mode):
    split = mode.split(ctx(3), ([1, 2, 3],), {"name": ("a", "b", "c")})
    assert split.per_rank == [((1,), {"name": "a"}), ((2,), {"name": "b"}), ((3,), {"name": "c"})]
    assert mode.collect(ctx(3), [4, 5, 6]) == [4, 5, 6]


@pytest.mark.parametrize("mode", [Dispatch.ALL_TO_ALL, Dispatch.DP_COMPUTE])
@pytest.mark.parametrize("args,kwargs,needle", [
    (([1, 2],), {}, "argument 0 has 2 values but the group has 3 ranks"),
    ((), {"x": [1, 2, 3, 4]}, "argument 'x' has 4 values"),
    ((5,), {}, "must be a list with one value per rank"),
])
def test_per_rank_modes_refuse_wrong_lengths(mode, args, kwargs, needle):
    with pytest.raises(DispatchError, match=needle):
        mode.split(ctx(3), args, kwargs)


def test_rank_zero_mode_returns_the_single_output():
    assert Dispatch.RANK_ZERO.rank_zero
    assert Dispatch.RANK_ZERO.collect(ctx(1), ["only"]) == "only"


def test_dp_compute_proto_splits_in_order_and_broadcasts_plain_values():
    split = Dispatch.DP_COMPUTE_PROTO.split(ctx(4), (proto(8), 0.5), {})
    assert split.pad_size == 0
    assert [first_column(args[0]) for args, _ in split.per_rank] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert all(args[1] == 0.5 for args, _ in split.per_rank)


def test_dp_compute_proto_pads_then_collect_strips_the_padding():
    data = proto(10)
    split = Dispatch.DP_COMPUTE_PROTO.split(ctx(4), (data,), {})
    assert split.pad_size == 2
    parts = [args[0] for args, _ in split.per_rank]
    assert [len(p) for p in parts] == [3, 3, 3, 3]
    collected = Dispatch.DP_COMPUTE_PROTO.collect(DispatchContext("r.m", "DP", 4, pad_size=2), parts)
    assert first_column(collected) == list(range(10))
    assert collected.non_tensor_batch["uid"].tolist() == data.non_tensor_batch["uid"].tolist()


def test_dp_compute_proto_without_padding_refuses_a_batch_that_does_not_divide():
    with pytest.raises(DispatchError, match="10 samples, not divisible by the 4 data-parallel ranks"):
        Dispatch.dp_compute_proto(pad=False).split(ctx(4), (proto(10),), {})
    split = Dispatch.dp_compute_proto(pad=False).split(ctx(4), (proto(8),), {})
    assert [len(a[0]) for a, _ in split.per_rank] == [2, 2, 2, 2]


def test_dp_compute_proto_refuses_dataprotos_of_different_batch_sizes():
    with pytest.raises(DispatchError, match=r"different batch sizes \(argument 0 has 8, argument 'other' has 6\)"):
        Dispatch.DP_COMPUTE_PROTO.split(ctx(2), (proto(8),), {"other": proto(6)})


def test_dp_compute_proto_needs_a_dataproto():
    with pytest.raises(DispatchError, match="no DataProto"):
        Dispatch.DP_COMPUTE_PROTO.split(ctx(2), (1, 2), {})


def test_non_dataproto_outputs_of_proto_modes_come_back_as_a_list():
    assert collect_dp_proto(ctx(2), [{"loss": 1.0}, {"loss": 2.0}]) == [{"loss": 1.0}, {"loss": 2.0}]


# -------------------------------------------------------------------------------- mesh

def dp2_tp2_mesh() -> tuple[MeshCoord, ...]:
    # ranks 2,3 serve dp 0 and ranks 0,1 serve dp 1; tp rank 0 (even ranks) collects.
    return tuple(MeshCoord(dp_rank=1 - r // 2, dp_size=2, is_collect=r % 2 == 0) for r in range(4))


def test_mesh_split_gives_tp_peers_the_same_part_and_collects_tp_rank_zero_in_dp_order():
    mesh = dp2_tp2_mesh()
    mode = Dispatch.MESH("actor")
    split = mode.split(ctx(4, mesh=mesh), (proto(4),), {})
    assert [first_column(a[0]) for a, _ in split.per_rank] == [[2, 3], [2, 3], [0, 1], [0, 1]]
    assert select_mesh(ctx(4, mesh=mesh)) == [2, 0]


@pytest.mark.parametrize("coords,needle", [
    ([MeshCoord(0, 2, True), None], r"ranks \[1\] did not register"),
    ([MeshCoord(0, 2, True), MeshCoord(0, 3, True)], "disagree on the dp size"),
    ([MeshCoord(0, 2, True), MeshCoord(0, 2, False)], r"no rank serves dp ranks \[1\]"),
    ([MeshCoord(0, 1, True), MeshCoord(0, 1, True)], "exactly one collecting rank per dp rank"),
])
def test_check_mesh_refuses_inconsistent_coordinates(coords, needle):
    with pytest.raises(DispatchError, match=needle):
        check_mesh("actor.m", "actor", coords)


# ------------------------------------------------------------------------ @register

def test_unknown_dispatch_mode_is_refused_at_decoration():
    with pytest.raises(ValueError, match="unknown dispatch mode 'SCATTER_ALL'"):
        register(dispatch="SCATTER_ALL")
    with pytest.raises(TypeError, match="dispatch must be a Dispatch mode"):
        register(dispatch=42)
    with pytest.raises(TypeError, match="execute must be"):
        register(execute="all")
    with pytest.raises(ValueError, match="cannot use Execute.RANK_ZERO"):
        register(dispatch=Dispatch.MESH("actor"), execute=Execute.RANK_ZERO)


def split_reversed(c: DispatchContext, args: tuple, kwargs: dict) -> list:
    return [((c.world_size - 1 - r,), {}) for r in range(c.world_size)]


def collect_sum(c: DispatchContext, outputs: list) -> int:
    return sum(outputs)


def test_custom_modes_are_registered_by_name():
    mode = register_dispatch_mode("unit_reversed", split_reversed, collect_sum)
    assert Dispatch.get("unit_reversed") is mode
    assert register_dispatch_mode("unit_reversed", split_reversed, collect_sum) == mode  # re-import is fine
    with pytest.raises(ValueError, match="different mode is already registered"):
        register_dispatch_mode("unit_reversed", split_reversed, lambda c, o: o)
    with pytest.raises(ValueError, match="built-in"):
        register_dispatch_mode("ONE_TO_ALL", split_reversed, collect_sum)


class Base(Worker):
    @register(dispatch=Dispatch.ONE_TO_ALL)
    def kept(self) -> int:
        return 1

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def dropped(self) -> int:
        return 2


class Child(Base):
    def dropped(self) -> int:  # overridden without @register: local only
        return 3

    @register(dispatch=Dispatch.RANK_ZERO, blocking=False)
    def added(self) -> int:
        return 4


def test_registered_methods_follow_inheritance():
    specs = registered_methods(Child)
    assert sorted(specs) == ["added", "kept"]
    assert specs["added"].rank_zero and not specs["added"].blocking


def test_worker_outside_a_group_is_rank_zero_of_one():
    worker = Child()
    assert (worker.rank, worker.world_size, worker.local_rank) == (0, 1, 0)
    worker.register_dispatch_mesh("m", dp_rank=0, dp_size=1, is_collect=True)
    assert worker.dispatch_mesh("m") == MeshCoord(0, 1, True)
    with pytest.raises(ValueError, match="outside"):
        worker.register_dispatch_mesh("m", dp_rank=2, dp_size=2, is_collect=True)


# ---------------------------------------------------------------------- ResourcePool

def test_resource_pool_validates_and_splits_without_reserving():
    with pytest.raises(ValueError, match="positive ints"):
        ResourcePool([2, 0])
    pool = ResourcePool([2, 2], max_colocate_count=2, cpus_per_slot=1.0)
    assert pool.world_size == 4
    assert pool.actor_options() == {"num_cpus": 0.5, "num_gpus": 0.0}
    first, second = pool.split([1, 3])
    assert (first.process_on_nodes, second.process_on_nodes) == ([1], [1, 2])
    with pytest.raises(ValueError, match="summing to the pool's 4 slots"):
        pool.split([3, 3])
