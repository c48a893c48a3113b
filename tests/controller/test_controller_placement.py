"""Split placement: two roles on two sub-pools of one reservation, futures between them
(same data-parallel size: parts go straight across; other sizes: regrouped next to the data)."""

from __future__ import annotations

import os

import pytest
import torch

from hybridflow.controller import (
    CallFuture,
    DataProtoFuture,
    Dispatch,
    Execute,
    ResourcePool,
    Worker,
    WorkerGroup,
    register,
)
from hybridflow.protocol import DataProto


def make_batch(n: int) -> DataProto:
    return DataProto.from_dict(tensors={"input_ids": torch.arange(n)[:, None] * 10 + torch.arange(3)[None, :]},
                               non_tensors={"uid": [f"u{i}" for i in range(n)]})


class Producer(Worker):
    @register(dispatch=Dispatch.ONE_TO_ALL)
    def pid(self) -> int:
        return os.getpid()

    @register(dispatch=Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def generate(self, batch: DataProto) -> DataProto:
        batch.batch["responses"] = batch.batch["input_ids"] + 1
        batch.batch["producer_rank"] = torch.full((len(batch),), self.rank)
        return batch

    @register(dispatch=Dispatch.RANK_ZERO, blocking=False)
    def whole_batch(self, n: int) -> DataProto:
        return make_batch(n)


class Consumer(Worker):
    @register(dispatch=Dispatch.ONE_TO_ALL)
    def pid(self) -> int:
        return os.getpid()

    @register(dispatch=Dispatch.DP_COMPUTE_PROTO)
    def score(self, batch: DataProto) -> DataProto:
        return DataProto.from_dict(tensors={"scores": batch.batch["input_ids"].sum(-1),
                                            "consumer_rank": torch.full((len(batch),), self.rank)},
                                   non_tensors={"uid": batch.non_tensor_batch["uid"]})

    @register(dispatch=Dispatch.DP_COMPUTE_PROTO, execute=Execute.RANK_ZERO)
    def score_on_rank_zero(self, batch: DataProto) -> DataProto:
        return self.score(batch)

    @register(dispatch=Dispatch.DP_COMPUTE_PROTO)
    def echo_producer_rank(self, batch: DataProto) -> DataProto:
        return DataProto.from_dict(tensors={"producer_rank": batch.batch["producer_rank"],
                                            "consumer_rank": torch.full((len(batch),), self.rank)})


@pytest.fixture(scope="module")
def split_groups(ray_local):
    pool = ResourcePool([4])
    left, right = pool.split([2, 2])
    producer, consumer = WorkerGroup(left, Producer), WorkerGroup(right, Consumer)
    yield producer, consumer, pool
    producer.shutdown()
    consumer.shutdown()
    pool.release()


def test_roles_on_different_pools_run_in_different_processes(split_groups):
    producer, consumer, pool = split_groups
    assert producer.world_size == consumer.world_size == 2
    assert not set(producer.pid()) & set(consumer.pid())
    slots = pool.slots()
    assert [(s.placement_group.id, s.bundle_index) for s in slots] == [(slots[0].placement_group.id, i)
                                                                       for i in range(4)]
    assert producer.resource_pool.slots() == slots[:2] and consumer.resource_pool.slots() == slots[2:]


def test_same_dp_size_future_parts_go_straight_to_the_matching_rank(split_groups):
    producer, consumer, _ = split_groups
    generated = producer.generate(make_batch(6))
    assert isinstance(generated, DataProtoFuture) and len(generated.parts) == 2
    out = consumer.echo_producer_rank(generated)
    assert out.batch["producer_rank"].tolist() == out.batch["consumer_rank"].tolist() == [0, 0, 0, 1, 1, 1]


def test_future_into_a_different_split_is_regrouped(split_groups):
    producer, consumer, _ = split_groups
    batch = make_batch(6)
    out = consumer.score_on_rank_zero(producer.generate(batch))  # 2 parts -> 1 rank
    assert torch.equal(out.batch["scores"], batch.batch["input_ids"].sum(-1))
    assert out.batch["consumer_rank"].tolist() == [0] * 6


def test_whole_value_future_is_split_with_padding(split_groups):
    producer, consumer, _ = split_groups
    whole = producer.whole_batch(5)  # one DataProto from rank 0, not yet split
    assert isinstance(whole, CallFuture) and not isinstance(whole, DataProtoFuture)
    out = consumer.score(whole)  # 5 rows over 2 ranks: padded to 6 remotely, unpadded here
    expected = make_batch(5)
    assert torch.equal(out.batch["scores"], expected.batch["input_ids"].sum(-1))
    assert out.batch["consumer_rank"].tolist() == [0, 0, 0, 1, 1]
    assert out.non_tensor_batch["uid"].tolist() == expected.non_tensor_batch["uid"].tolist()


def test_submit_and_value_futures_keep_the_data_off_the_controller(split_groups):
    """A blocking method submitted without waiting, fed from an object ref made outside any
    group: the controller's fetch count grows only by what it finally collects."""
    import ray

    from hybridflow.controller import FETCHED, value_future
    from hybridflow.controller.futures import RankInfo, payload_bytes

    producer, consumer, _ = split_groups
    batch = make_batch(6)
    before = (FETCHED.values, FETCHED.tensor_bytes)
    scored = consumer.submit("score", value_future(ray.put(batch), "test.put", RankInfo("test", 0, "", None)))
    assert isinstance(scored, DataProtoFuture) and (FETCHED.values, FETCHED.tensor_bytes) == before
    echoed = consumer.submit("echo_producer_rank", producer.generate(batch))
    assert (FETCHED.values, FETCHED.tensor_bytes) == before  # nothing fetched while calls pass futures on
    out = scored.get()
    assert torch.equal(out.batch["scores"], batch.batch["input_ids"].sum(-1))
    assert FETCHED.values == before[0] + 3  # one part per rank, and the regrouped input's padding size (an int)
    assert FETCHED.tensor_bytes - before[1] == payload_bytes(out.batch) + payload_bytes(out.non_tensor_batch)
    assert echoed.get().batch["producer_rank"].tolist() == [0, 0, 0, 1, 1, 1]
    with pytest.raises(ValueError, match="not a registered method"):
        consumer.submit("nope", batch)


def test_a_second_group_on_full_slots_is_refused_at_once(split_groups):
    producer, _, _ = split_groups
    # max_colocate_count=1 and the producer holds these slots: Ray would wait forever.
    with pytest.raises(RuntimeError, match="already host 1 worker group"):
        WorkerGroup(producer.resource_pool, Consumer)
    assert producer.pid()  # the existing group is untouched
