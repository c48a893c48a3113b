"""One 4-process group hosting three colocated roles, driven through every dispatch mode.

Roles: ``actor`` (Probe: every mode, gloo all-reduce, failures), ``critic`` (consumes the
actor's futures) and ``mesh`` (dp=2 x tp=2 layout where only tp rank 0 returns). They
share processes, so the whole module pays for four actor start-ups once.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

from hybridflow.controller import (
    CallFuture,
    DataProtoFuture,
    Dispatch,
    DispatchError,
    Execute,
    ResourcePool,
    RoleSpec,
    Worker,
    WorkerError,
    create_colocated_worker_groups,
    register,
    register_dispatch_mode,
)
from hybridflow.protocol import DataProto

WORLD = 4
FILE_WAIT_S = 120.0  # a worker gives up waiting for the test's go-ahead file after this


def split_reversed(ctx, args, kwargs):
    """Custom mode: rank r gets element world-1-r of the (only) list argument."""
    (values,) = args
    return [((values[ctx.world_size - 1 - r],), {}) for r in range(ctx.world_size)]


def collect_sum(ctx, outputs):
    return sum(outputs)


REVERSED = register_dispatch_mode("test_reversed_sum", split_reversed, collect_sum)


def make_batch(n: int, width: int = 4) -> DataProto:
    rows = torch.arange(n)
    return DataProto.from_dict(
        tensors={"input_ids": rows[:, None] * 100 + torch.arange(width)[None, :],
                 "attention_mask": torch.ones(n, width, dtype=torch.int64)},
        non_tensors={"uid": [f"u{i}" for i in range(n)]},
        meta_info={"temperature": 1.0},
    )


def span(seconds: float) -> dict:
    start = time.time()
    time.sleep(seconds)
    return {"pid": os.getpid(), "start": start, "end": time.time()}


class Probe(Worker):
    def __init__(self, scale: int) -> None:
        self.scale = scale
        self.calls = 0

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def whoami(self) -> dict:
        env = {k: os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
        return {"rank": self.rank, "world_size": self.world_size, "local_rank": self.local_rank,
                "role": self.role, "pid": os.getpid(), "env": env}

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def call_count(self) -> int:
        return self.calls

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def scaled(self, x: int, *, offset: int = 0) -> int:
        self.calls += 1
        return x * self.scale + offset + self.rank

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def row_sum(self, batch: DataProto) -> int:
        return int(batch.batch["input_ids"].sum())

    @register(dispatch=Dispatch.ALL_TO_ALL)
    def pair(self, a: int, b: str) -> tuple:
        self.calls += 1
        return self.rank, a, b

    @register(dispatch=Dispatch.RANK_ZERO)
    def leader(self, x: int) -> tuple:
        self.calls += 1
        return self.rank, x

    @register(dispatch=Dispatch.ONE_TO_ALL, execute=Execute.RANK_ZERO)
    def only_zero(self) -> int:
        return self.rank

    @register(dispatch=Dispatch.DP_COMPUTE)
    def dp_list(self, item: int) -> tuple:
        self.calls += 1
        return self.rank, item * 2

    @register(dispatch=REVERSED)
    def custom(self, value: int) -> int:
        return value * 10 + self.rank

    @register(dispatch=Dispatch.DP_COMPUTE_PROTO)
    def double(self, batch: DataProto) -> DataProto:
        self.calls += 1
        return self._double(batch)

    @register(dispatch=Dispatch.dp_compute_proto(pad=False))
    def double_strict(self, batch: DataProto) -> DataProto:
        self.calls += 1
        return self._double(batch)

    @register(dispatch=Dispatch.DP_COMPUTE_PROTO)
    def add(self, a: DataProto, b: DataProto) -> DataProto:
        self.calls += 1
        return DataProto.from_dict(tensors={"sum": a.batch["input_ids"] + b.batch["input_ids"]})

    @register(dispatch=Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def double_after_file(self, batch: DataProto, path: str) -> DataProto:
        deadline = time.monotonic() + FILE_WAIT_S
        while not os.path.exists(path):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the test never created {path}")
            time.sleep(0.05)
        return self._double(batch)

    @register(dispatch=Dispatch.ONE_TO_ALL, blocking=False)
    def scaled_async(self, x: int) -> int:
        return x * self.scale + self.rank

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def all_reduce(self, values: list[float]) -> list[float]:
        import torch.distributed as dist

        self.init_process_group()
        tensor = torch.tensor(values) * (self.rank + 1)
        dist.all_reduce(tensor)
        return tensor.tolist()

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def fail_on(self, rank: int) -> int:
        self.calls += 1
        if self.rank == rank:
            raise ValueError(f"boom on purpose in rank {rank}")
        return self.rank

    @register(dispatch=Dispatch.ONE_TO_ALL, blocking=False)
    def fail_on_async(self, rank: int) -> int:
        return self.fail_on(rank)

    @register(dispatch=Dispatch.ONE_TO_ALL, blocking=False)
    def span(self, seconds: float) -> dict:
        return span(seconds)

    def _double(self, batch: DataProto) -> DataProto:
        out = DataProto.from_dict(tensors={"doubled": batch.batch["input_ids"] * 2,
                                           "rank": torch.full((len(batch),), self.rank)},
                                  meta_info=batch.meta_info)
        return out.union(batch.select(non_tensor_keys=["uid"], batch_keys=[], meta_info_keys=[]))


class Critic(Worker):
    @register(dispatch=Dispatch.ONE_TO_ALL)
    def whoami(self) -> dict:
        return {"rank": self.rank, "role": self.role, "pid": os.getpid()}

    @register(dispatch=Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def score(self, batch: DataProto) -> DataProto:
        return DataProto.from_dict(tensors={"values": batch.batch["doubled"] + 1,
                                            "rank": torch.full((len(batch),), self.rank)})

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def receive(self, value: object) -> object:
        return value

    @register(dispatch=Dispatch.ONE_TO_ALL, blocking=False)
    def span(self, seconds: float) -> dict:
        return span(seconds)


class MeshWorker(Worker):
    """dp=2 x tp=2 with a deliberately unusual layout: ranks 2,3 serve dp 0, ranks 0,1 dp 1;
    tp rank 0 (even ranks) is the one whose output the controller collects."""

    def __init__(self) -> None:
        self.tp_rank = self.rank % 2
        self.dp_rank = 1 - self.rank // 2
        self.tp_group = None
        self.register_dispatch_mesh("mesh", dp_rank=self.dp_rank, dp_size=2, is_collect=self.tp_rank == 0)

    @register(dispatch=Dispatch.MESH("mesh"))
    def forward(self, batch: DataProto) -> DataProto:
        import torch.distributed as dist

        self.init_process_group()
        if self.tp_group is None:  # every rank creates both tp groups, in the same order
            self.tp_group, _ = dist.new_subgroups_by_enumeration([[0, 1], [2, 3]])
        # tp peers hold the same rows: summing (tp_rank + 1) * ids over tp gives 3 * ids.
        tp_sum = batch.batch["input_ids"].float() * (self.tp_rank + 1)
        dist.all_reduce(tp_sum, group=self.tp_group)
        return DataProto.from_dict(tensors={"tp_sum": tp_sum, "rank": torch.full((len(batch),), self.rank)})


@pytest.fixture(scope="module")
def groups(ray_local):
    pool = ResourcePool([WORLD])
    roles = {"actor": RoleSpec(Probe, (3,)), "critic": RoleSpec(Critic), "mesh": RoleSpec(MeshWorker)}
    created = create_colocated_worker_groups(pool, roles)
    yield created
    created["actor"].shutdown()
    pool.release()


# ------------------------------------------------------------------------ group basics

def test_ranks_know_their_place_and_share_one_rendezvous(groups):
    infos = groups["actor"].whoami()
    assert [i["rank"] for i in infos] == [0, 1, 2, 3]
    assert {i["world_size"] for i in infos} == {WORLD}
    assert [i["local_rank"] for i in infos] == [0, 1, 2, 3]  # one node
    assert [i["env"]["RANK"] for i in infos] == ["0", "1", "2", "3"]
    assert len({(i["env"]["MASTER_ADDR"], i["env"]["MASTER_PORT"]) for i in infos}) == 1
    assert infos[0]["env"]["MASTER_ADDR"] == "127.0.0.1"  # embedded Ray stays on loopback
    assert {i["role"] for i in infos} == {"actor"}
    assert len({i["pid"] for i in infos}) == WORLD


def test_all_reduce_over_gloo_matches_a_single_process_sum(groups):
    values = [1.0, -2.0, 0.5]
    expected = (torch.tensor(values) * sum(r + 1 for r in range(WORLD))).tolist()
    assert groups["actor"].all_reduce(values) == [expected] * WORLD


# ------------------------------------------------------------------------ every mode

def test_one_to_all(groups):
    assert groups["actor"].scaled(2, offset=1) == [2 * 3 + 1 + r for r in range(WORLD)]


def test_one_to_all_sends_a_whole_dataproto_to_every_rank(groups):
    batch = make_batch(8)
    assert groups["actor"].row_sum(batch) == [int(batch.batch["input_ids"].sum())] * WORLD


def test_all_to_all(groups):
    assert groups["actor"].pair([10, 11, 12, 13], b=list("abcd")) == [
        (0, 10, "a"), (1, 11, "b"), (2, 12, "c"), (3, 13, "d")]


def test_rank_zero_dispatch_and_execute(groups):
    assert groups["actor"].leader(7) == (0, 7)
    assert groups["actor"].only_zero() == [0]


def test_dp_compute(groups):
    assert groups["actor"].dp_list([1, 2, 3, 4]) == [(0, 2), (1, 4), (2, 6), (3, 8)]


def test_custom_mode(groups):
    # rank r receives values[3 - r] = 3 - r, returns (3 - r) * 10 + r; the collect sums.
    assert groups["actor"].custom([0, 1, 2, 3]) == sum((3 - r) * 10 + r for r in range(WORLD))


def test_dp_compute_proto_divisible(groups):
    batch = make_batch(8)
    out = groups["actor"].double(batch)
    assert torch.equal(out.batch["doubled"], batch.batch["input_ids"] * 2)
    assert out.batch["rank"].tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert out.non_tensor_batch["uid"].tolist() == batch.non_tensor_batch["uid"].tolist()
    assert out.meta_info == {"temperature": 1.0}


def test_dp_compute_proto_pads_and_strips_padding(groups):
    batch = make_batch(10)
    out = groups["actor"].double(batch)
    assert len(out) == 10
    assert torch.equal(out.batch["doubled"], batch.batch["input_ids"] * 2)
    assert out.batch["rank"].tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3]  # 3 rows each incl. 2 pads
    assert out.non_tensor_batch["uid"].tolist() == batch.non_tensor_batch["uid"].tolist()


def test_dp_compute_proto_with_two_dataprotos(groups):
    a, b = make_batch(8), make_batch(8, width=4)
    assert torch.equal(groups["actor"].add(a, b=b).batch["sum"], a.batch["input_ids"] * 2)


def test_mesh_collects_only_tp_rank_zero_in_dp_order(groups):
    batch = make_batch(6)
    out = groups["mesh"].forward(batch)
    assert torch.equal(out.batch["tp_sum"], batch.batch["input_ids"].float() * 3)
    # dp 0 (rows 0-2) is served by ranks 2,3 and collected from rank 2; dp 1 from rank 0.
    assert out.batch["rank"].tolist() == [2, 2, 2, 0, 0, 0]


# ------------------------------------------------------------------ colocation, futures

def test_colocated_roles_share_processes_and_run_one_after_another(groups):
    actor_pids = [i["pid"] for i in groups["actor"].whoami()]
    critic = groups["critic"].whoami()
    assert [i["pid"] for i in critic] == actor_pids
    assert {i["role"] for i in critic} == {"critic"}
    first, second = groups["actor"].span(0.5), groups["critic"].span(0.1)
    for a, c in zip(first.get(), second.get()):
        assert a["pid"] == c["pid"]
        assert c["start"] >= a["end"]  # queued behind the actor's call in the same process


def test_future_flows_to_another_group_without_the_controller_waiting(groups, tmp_path: Path):
    go = tmp_path / "go"
    batch = make_batch(8)
    doubled = groups["actor"].double_after_file(batch, str(go))
    assert isinstance(doubled, DataProtoFuture)
    # The actor is blocked until `go` exists; if the controller waited for `doubled`
    # here, this call would never return.
    scored = groups["critic"].score(doubled)
    assert isinstance(scored, DataProtoFuture)
    assert not doubled.done() and not scored.done()
    go.touch()
    result = scored.get()
    assert torch.equal(result.batch["values"], batch.batch["input_ids"] * 2 + 1)
    assert result.batch["rank"].tolist() == [0, 0, 1, 1, 2, 2, 3, 3]  # part i went to rank i
    assert torch.equal(doubled.get().batch["doubled"], batch.batch["input_ids"] * 2)


def test_a_whole_value_future_reaches_every_rank(groups):
    future = groups["actor"].scaled_async(5)
    assert isinstance(future, CallFuture)
    expected = [5 * 3 + r for r in range(WORLD)]
    assert groups["critic"].receive(future) == [expected] * WORLD


# ------------------------------------------------------------------------- failures

def test_a_worker_exception_names_role_rank_and_carries_the_traceback(groups):
    with pytest.raises(WorkerError) as caught:
        groups["actor"].fail_on(2)
    err = caught.value
    assert (err.role, err.rank, err.method, err.died) == ("actor", 2, "actor.fail_on", False)
    assert "actor rank 2" in str(err) and "boom on purpose in rank 2" in str(err)
    assert "in fail_on" in err.remote_traceback and "test_controller_worker_group.py" in err.remote_traceback
    # The group is still usable after a worker exception.
    assert groups["actor"].leader(1) == (0, 1)


def test_a_failing_future_raises_on_get(groups):
    future = groups["actor"].fail_on_async(1)
    with pytest.raises(WorkerError, match="actor rank 1") as caught:
        future.get()
    assert caught.value.rank == 1


@pytest.mark.parametrize("call,needle", [
    (lambda g: g.pair([1, 2, 3], list("abcd")), "argument 0 has 3 values but the group has 4 ranks"),
    (lambda g: g.dp_list([1, 2, 3, 4, 5]), "argument 0 has 5 values"),
    (lambda g: g.add(make_batch(8), make_batch(6)), "different batch sizes"),
    (lambda g: g.double_strict(make_batch(10)), "not divisible by the 4 data-parallel ranks"),
])
def test_bad_dispatch_input_is_refused_before_any_worker_runs(groups, call, needle):
    before = groups["actor"].call_count()
    with pytest.raises(DispatchError, match=needle):
        call(groups["actor"])
    assert groups["actor"].call_count() == before


# ------------------------------------------------------------------------ a group sent to a task

def _double_in_a_task(group, batch):
    """What a Ray task does with a group it received (trainer/modes/stream_step.py runs a step program so)."""
    out = group.double(batch)
    try:
        group.shutdown()
    except RuntimeError as err:  # only the owner may
        return out, str(err)
    return out, None


def test_a_group_sent_to_a_ray_task_calls_the_same_workers_and_cannot_shut_them_down(groups):
    import ray

    batch = make_batch(8)
    out, refused = ray.get(ray.remote(num_cpus=0)(_double_in_a_task).remote(groups["actor"], batch))
    assert torch.equal(out.batch["doubled"], batch.batch["input_ids"] * 2)
    assert out.batch["rank"].tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert refused is not None and "owner" in refused
    assert groups["actor"].whoami()[0]["rank"] == 0  # still alive for its owner


def _produce_group():
    import ray

    # 1 MiB goes to the object store (not inlined): the object lives and dies with this process
    return [ray.put(torch.zeros(1 << 18))]


def test_groups_lost_with_the_process_that_made_them_fail_the_step_as_that_process(ray_local):
    """A step program's task whose input groups died with the rollout rank that generated
    them: the error is the workers' (the trainer then names the dead pool), never passed
    off as the program's own exception."""
    import ray
    from ray.exceptions import ObjectLostError

    from hybridflow.controller.futures import RankInfo, gather
    from hybridflow.trainer.modes.stream_step import _program_error

    producer = ray.remote(num_cpus=0)(type("Producer", (), {"make": lambda self: _produce_group()})).remote()
    (group,) = ray.get(producer.make.remote())
    ray.kill(producer)
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(producer.make.remote(), timeout=60)
    program = ray.remote(num_cpus=0, max_retries=0)(lambda g: float(g.sum()))
    owner = [RankInfo("step_program", 0, "127.0.0.1", None)]
    deadline = time.monotonic() + 60
    while True:  # the object store lets the objects go a moment after Ray declares the death
        try:
            gather([program.remote(group)], owner, "step_program")
        except WorkerError as err:
            lost = err
            break
        assert time.monotonic() < deadline, "the dead producer's group stayed readable for 60 s"
        time.sleep(0.5)
    assert isinstance(lost.__cause__.cause, ObjectLostError)
    assert _program_error(lost) is lost
