"""`P.concurrently` (trainer/programs/concurrent.py): the phases of a block are submitted
together and their results applied at its end in program order, exactly as one after
another; a block whose phases depend on each other is refused.

The overlap itself is shown on Ray with two worker groups on processes of their own (split
placement): each call waits, for a bounded time, for a file the other call writes when it
starts, so a call sees the other only if both were submitted before either was awaited. The
rules run on in-process groups (no Ray), the same calls the programs make. A process killed
in one of a block's calls (roles colocated) is reported with that call and its phase.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import torch

from hybridflow.controller import (Dispatch, IN_PROCESS, ResourcePool, RoleSpec, Worker, WorkerError,
                                   WorkerGroup, create_colocated_worker_groups, register)
from hybridflow.protocol import DataProto
from hybridflow.trainer.programs import phases as P
from hybridflow.trainer.programs.concurrent import ConcurrencyError

# ----------------------------------------------------------------------------- phases of a test program


class Arith(Worker):
    """out = in + 1, names from meta_info (one worker serves every phase below)."""

    @register(dispatch=Dispatch.DP_COMPUTE_PROTO)
    def plus_one(self, batch: DataProto) -> DataProto:
        return DataProto.from_dict({batch.meta_info["dst"]: batch.batch[batch.meta_info["src"]] + 1})


def _plus_one_input(step: P.Step, src: str, dst: str) -> DataProto:
    data = step.batch.select(batch_keys=[src], non_tensor_keys=[], meta_info_keys=[])
    data.meta_info.update(src=src, dst=dst)
    return data


def _record(step: P.Step, dst: str):
    def then(out: DataProto) -> None:
        step.batch.batch[dst] = out.batch[dst]  # a new key, or a new value of one
        step.metrics[f"{dst}/sum"] = float(out.batch[dst].sum())

    return then


@P.phase("plus_one")
def plus_one(step: P.Step, group, src: str, dst: str) -> None:
    """dst = src + 1."""
    step.metrics[f"{dst}/submitted"] = 1.0  # written before the call: stays before its result's metrics
    P.dp_call(step, group, "plus_one", _plus_one_input(step, src, dst), then=_record(step, dst))


@P.phase("reads_metric")
def reads_metric(step: P.Step, key: str) -> None:
    step.metrics["copy"] = step.metrics.get(key, -1.0)


@P.phase("twice")
def twice(step: P.Step, group) -> None:
    """A phase whose second call reads what its first call's result writes."""
    P.dp_call(step, group, "plus_one", _plus_one_input(step, "x", "y"), then=_record(step, "y"))
    P.dp_call(step, group, "plus_one", _plus_one_input(step, "y", "z"), then=_record(step, "z"))


@P.phase("writes_batch")
def writes_batch(step: P.Step) -> None:
    step.batch.batch["w"] = step.batch.batch["x"] * 2


@P.phase("replaces_batch")
def replaces_batch(step: P.Step) -> None:
    step.batch = DataProto.from_dict({"x": torch.zeros(4)})


@P.phase("no_then")
def no_then(step: P.Step, group) -> None:
    P.dp_call(step, group, "plus_one", _plus_one_input(step, "x", "y"))


def _step(**tensors: torch.Tensor) -> P.Step:
    return P.Step(1, DataProto.from_dict({"x": torch.arange(4.0), **tensors}), balance_dp=False)


@pytest.fixture(scope="module")
def group():
    yield (group := WorkerGroup(IN_PROCESS, Arith))
    group.shutdown()


def _independent(step: P.Step, group) -> None:
    plus_one(step, group, "x", "y")
    plus_one(step, group, "x", "z")
    reads_metric(step, "before")  # a metric from before the block: no phase of the block writes it


def step_keys(step: P.Step) -> list[str]:
    """The keys of step.batch, looked at without counting as a read of the program's."""
    return list(dict.keys(step.batch.batch))


def _untimed(metrics: dict) -> list[tuple[str, float]]:
    return [(k, v) for k, v in metrics.items() if not k.startswith("timing_s/")]


def test_a_block_ends_exactly_as_its_phases_one_after_another(group):
    sequential, block = _step(), _step()
    for step in (sequential, block):
        step.metrics["before"] = 7.0
    _independent(sequential, group)
    with P.concurrently(block):
        _independent(block, group)
        assert step_keys(block) == ["x"]  # the results wait for the block's end
    assert type(block.batch.batch) is dict and type(block.metrics) is dict  # the step's own dicts again
    assert list(block.batch.batch) == list(sequential.batch.batch) == ["x", "y", "z"]
    assert all(torch.equal(block.batch.batch[k], sequential.batch.batch[k]) for k in "xyz")
    assert _untimed(block.metrics) == _untimed(sequential.metrics)  # values and key order
    assert block.metrics["copy"] == 7.0
    assert {"timing_s/plus_one", "timing_s/reads_metric"} <= set(block.metrics)


def test_a_phase_that_reads_what_another_of_the_block_writes_is_refused(group):
    step = _step(y=torch.zeros(4))
    with pytest.raises(ConcurrencyError, match=r"phase 'plus_one' read step.batch\['y'\].*phase 'plus_one' of the "
                                               r"same block writes \['y'\]"):
        with P.concurrently(step):
            plus_one(step, group, "x", "y")
            plus_one(step, group, "y", "z")  # would read the old y: the first result is not in yet
    # The same two phases one after another are fine.
    plus_one(step := _step(y=torch.zeros(4)), group, "x", "y")
    plus_one(step, group, "y", "z")
    assert step.batch.batch["z"].tolist() == [2.0, 3.0, 4.0, 5.0]


def test_a_read_of_a_result_not_in_yet_says_why(group):
    """Where the key does not exist before the block, the read fails at once; the error
    then says that the block's results come at its end."""
    with pytest.raises(KeyError, match=r"unknown batch key\(s\) \['y'\]") as raised:
        with P.concurrently(step := _step()):
            plus_one(step, group, "x", "y")
            plus_one(step, group, "y", "z")
    assert any("results of the calls of phase 'plus_one' are applied at its end" in note
               for note in raised.value.__notes__)


def test_reading_a_metric_another_phase_of_the_block_records_is_refused(group):
    step = _step()
    with pytest.raises(ConcurrencyError, match=r"phase 'reads_metric' read step.metrics\['y/sum'\]"):
        with P.concurrently(step):
            plus_one(step, group, "x", "y")
            reads_metric(step, "y/sum")


def test_a_phase_reading_its_own_calls_result_inside_a_block_is_refused(group):
    step = _step(y=torch.zeros(4))
    with pytest.raises(ConcurrencyError, match=r"phase 'twice' read step.batch\['y'\] after its own call"):
        with P.concurrently(step):
            twice(step, group)


def test_reading_what_a_later_phase_writes_is_allowed(group):
    """Write after read: the earlier phase sees the old value in both orders."""
    sequential, block = _step(y=torch.full((4,), 10.0)), _step(y=torch.full((4,), 10.0))
    for step in (sequential, block):
        with P.concurrently(step) if step is block else _nothing():
            plus_one(step, group, "y", "z")  # reads y ...
            plus_one(step, group, "x", "y")  # ... which this one writes afterwards
    for key in "yz":
        assert torch.equal(block.batch.batch[key], sequential.batch.batch[key]), key
    assert block.batch.batch["z"].tolist() == [11.0] * 4


def _nothing():
    import contextlib

    return contextlib.nullcontext()


@pytest.mark.parametrize("phase, message", [
    (writes_batch, r"phase 'writes_batch' wrote step.batch \(batch\) key 'w' inside a concurrently block"),
    (replaces_batch, r"phase 'replaces_batch' replaced step.batch inside a concurrently block"),
])
def test_changing_the_batch_directly_inside_a_block_is_refused(phase, message):
    step = _step()
    with pytest.raises(ConcurrencyError, match=message):
        with P.concurrently(step):
            phase(step)
    assert type(step.batch.batch) is dict and list(step.batch.batch) == ["x"]  # nothing applied


def test_dp_call_in_a_block_needs_then(group):
    with pytest.raises(ConcurrencyError, match=r"inside a concurrently block needs then="):
        with P.concurrently(step := _step()):
            no_then(step, group)


def test_a_block_inside_a_block_is_part_of_it_and_an_error_applies_nothing(group):
    step = _step()
    with pytest.raises(ValueError, match="the program failed"):
        with P.concurrently(step):
            with P.concurrently(step):
                plus_one(step, group, "x", "y")
            assert step.block is not None  # still the outer block
            raise ValueError("the program failed")
    assert step.block is None and list(step.batch.batch) == ["x"] and step.metrics == {}


# ----------------------------------------------------------------------------- on Ray, split placement


def _wait_for(path: Path, limit_s: float) -> bool:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if path.exists():
            return True
        time.sleep(0.01)
    return path.exists()


class Meeting(Worker):
    """`meet` announces its start in a file and waits (up to meta_info["wait_s"]) for the
    other group's announcement: it reports whether both calls were running at once."""

    def __init__(self, name: str, other: str) -> None:
        self.name, self.other = name, other

    @register(dispatch=Dispatch.DP_COMPUTE_PROTO)
    def meet(self, batch: DataProto) -> DataProto:
        folder = Path(batch.meta_info["folder"])
        (folder / self.name).touch()
        met = _wait_for(folder / self.other, batch.meta_info["wait_s"])
        return DataProto.from_dict({self.name: batch.batch["x"] * (2 if self.name == "left" else -1),
                                    f"{self.name}_met": torch.full((len(batch),), float(met))})

    @register(dispatch=Dispatch.DP_COMPUTE_PROTO)
    def fail(self, batch: DataProto) -> DataProto:
        raise ValueError(f"{self.name} cannot")


@P.phase("meet")
def meet(step: P.Step, group, folder: Path, wait_s: float) -> None:
    data = step.batch.select(batch_keys=["x"], non_tensor_keys=[], meta_info_keys=[])
    data.meta_info.update(folder=str(folder), wait_s=wait_s)
    P.dp_call(step, group, "meet", data, then=step.batch.union)


@pytest.fixture(scope="module")
def split_groups(ray_local):
    pool = ResourcePool([2])
    left_pool, right_pool = pool.split([1, 1])
    left, right = WorkerGroup(left_pool, Meeting, "left", "right"), WorkerGroup(right_pool, Meeting, "right", "left")
    yield left, right
    left.shutdown()
    right.shutdown()
    pool.release()


@P.phase("fails")
def fails(step: P.Step, group) -> None:
    P.dp_call(step, group, "fail", step.batch.select(batch_keys=["x"], non_tensor_keys=[]), then=step.batch.union)


def _meeting(groups, folder: Path, wait_s: float, block: bool, concurrent: bool = True) -> P.Step:
    folder.mkdir()
    step = P.Step(1, DataProto.from_dict({"x": torch.arange(4.0)}), concurrent=concurrent)
    with P.concurrently(step) if block else _nothing():
        for group in groups:
            meet(step, group, folder, wait_s)
    return step


def test_the_calls_of_a_block_run_at_once_on_processes_of_their_own(split_groups, tmp_path):
    left, right = split_groups
    assert not set(left.workers) & set(right.workers)
    # Each call sees the other running: both were submitted before either was awaited
    # (waited for one after another, the first would wait its 60 s out and report 0).
    step = _meeting(split_groups, tmp_path / "block", 60.0, block=True)
    assert step.batch.batch["left_met"].tolist() == step.batch.batch["right_met"].tolist() == [1.0] * 4
    # One after another (no block; or trainer.concurrent_phases=false) the first never meets
    # the second, with the same outputs otherwise.
    for name, kwargs in (("sequential", {"block": False}), ("not_concurrent", {"block": True, "concurrent": False})):
        other = _meeting(split_groups, tmp_path / name, 1.0, **kwargs)
        assert other.batch.batch["left_met"].tolist() == [0.0] * 4, name
        assert list(other.batch.batch) == list(step.batch.batch)
        assert torch.equal(other.batch.batch["left"], step.batch.batch["left"])
        assert torch.equal(other.batch.batch["right"], step.batch.batch["right"])


# ----------------------------------------------------------------------------- the built-in programs, split


@pytest.mark.slow  # four tiny Safe-RLHF runs on 2 + 1 processes
@pytest.mark.parametrize("mode", [(), pytest.param(("trainer.mode=async", "async_rl.max_staleness=0",
                                                      "async_rl.rollout_ranks=1"), marks=pytest.mark.extended)],
                         ids=["sync", "async"])
def test_safe_rlhf_split_logs_the_same_numbers_with_and_without_concurrent_phases(mode, ray_local, tiny_config,
                                                                                   tmp_path):
    """With split placement the log-probs run beside the two critics' values and the actor's
    update beside theirs (in async mode inside the step's task); the numbers are those of the
    calls one after another (trainer.concurrent_phases=false)."""
    from hybridflow import RLTrainer
    from test_algorithms_e2e import STEPPED_COST, VARIED_REWARD
    from test_recorded_metrics import comparable
    from trainer_helpers import rl_records

    (tmp_path / "reward.py").write_text(VARIED_REWARD, encoding="utf-8")
    (tmp_path / "cost.py").write_text(STEPPED_COST, encoding="utf-8")
    base = ("algorithm.name=safe_rlhf", f"reward.custom_fn_path={tmp_path / 'reward.py'}",
            f"cost_model.custom_fn_path={tmp_path / 'cost.py'}", "resources.world_size=2",
            "resources.placement=split", "resources.critic_ranks=1", "trainer.val_before_train=false", *mode)
    runs = {}
    for concurrent in ("true", "false"):
        with RLTrainer(tiny_config(*base, f"trainer.concurrent_phases={concurrent}")) as trainer:
            runs[concurrent] = [comparable(r) for r in rl_records(trainer.train(steps=2).run_dir)]
    assert len(runs["true"]) == 2 and "cost_critic/vf_loss" in runs["true"][0] and "critic/vf_loss" in runs["true"][0]
    assert runs["true"] == runs["false"]


def test_a_failing_call_raises_at_the_blocks_end_and_nothing_is_applied(split_groups, tmp_path):
    from hybridflow.controller import WorkerError

    left, right = split_groups
    (tmp_path / "right").touch()  # left's call need not wait
    step = P.Step(1, DataProto.from_dict({"x": torch.arange(4.0)}))
    with pytest.raises(WorkerError, match=r"Meeting rank 0 .* raised in Meeting.fail: ValueError: right cannot"):
        with P.concurrently(step):
            meet(step, left, tmp_path, 0.0)
            fails(step, right)
    assert step_keys(step) == ["x"] and step.metrics == {}


# ----------------------------------------------------------------------------- on Ray, colocated: who failed


class Updater(Worker):
    """A block's call: it takes a moment and finishes, or (`dies`) rank 1's process SIGKILLs
    itself as the call starts."""

    def __init__(self, dies: bool) -> None:
        self.dies = dies

    @register(dispatch=Dispatch.DP_COMPUTE_PROTO)
    def update(self, batch: DataProto) -> DataProto:
        if self.dies and self.rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.5)
        return DataProto.from_dict({"updated": batch.batch["x"] + 1})


@P.phase("update_critic")
def update_first(step: P.Step, group) -> None:
    P.dp_call(step, group, "update", step.batch.select(batch_keys=["x"], non_tensor_keys=[]), then=step.batch.union)


@P.phase("update_actor")
def update_second(step: P.Step, group) -> None:
    P.dp_call(step, group, "update", step.batch.select(batch_keys=["x"], non_tensor_keys=[]), then=step.batch.union)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("dying, phase", [("actor", "update_actor"), pytest.param("critic", "update_critic", marks=pytest.mark.extended)])
def test_a_process_killed_in_a_blocks_call_is_reported_with_that_call_and_phase(dying, phase, ray_local):
    """The recovery test's case (tests/trainer/test_resume.py) in small: critic and actor
    share two processes, the block submits the critic's update then the actor's, and rank 1
    dies as the `dying` role's call starts. The error, and the live phase a restart record
    takes, are that call's. (With the actor dying, the critic's call there had finished, but
    its reply could be lost with the process, and the block named the critic; a call is now
    held back until the controller has the result of the one before it on its process:
    controller/worker_group.py HostSet.submit. With the critic dying, the phase used to be
    the block's last, update_actor.)"""
    pool = ResourcePool([2])
    try:
        for _ in range(3):  # each round kills rank 1: a fresh pair
            roles = {role: RoleSpec(Updater, (role == dying,)) for role in ("critic", "actor")}
            groups = create_colocated_worker_groups(pool, roles)
            phases: list[str] = []
            step = P.Step(1, DataProto.from_dict({"x": torch.arange(4.0)}), balance_dp=False, on_phase=phases.append)
            try:
                with pytest.raises(WorkerError) as caught:
                    with P.concurrently(step):
                        update_first(step, groups["critic"])
                        update_second(step, groups["actor"])
            finally:
                groups["critic"].shutdown()
            err = caught.value
            assert (err.role, err.rank, err.died, err.method) == (dying, 1, True, f"{dying}.update"), str(err)
            assert phases[-1] == phase and step_keys(step) == ["x"]
    finally:
        pool.release()
