"""Automatic recovery (trainer/run/recovery.py, controller/faults.py): the supervisor's rules
without Ray (a failure at the same step counts toward trainer.max_restarts, one at a later
step gets a fresh budget), and real failures injected into 2-rank GRPO runs: a worker error
repeating at the same step stops after trainer.max_restarts with the last error; a rank hanging in a collective is
caught by trainer.call_timeout_s and its process killed. (A kill -9 mid-run that recovers
with the uninterrupted metrics is in test_resume.py, next to its reference run.)

    .venv/bin/python -m pytest -q tests/trainer/test_recovery.py
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hybridflow import RLTrainer
from hybridflow.controller import CallTimeoutError, WorkerError
from hybridflow.controller.faults import Fault, FaultInjector, fault_runtime_env
from hybridflow.trainer.run.lifecycle import resume_point
from hybridflow.trainer.observe.live_status import read_status
from hybridflow.trainer.run.recovery import CannotRestart, Failure, supervise
from hybridflow.trainer.run.run_dir import read_metrics
from trainer_helpers import TINY, rl_records

ROOT = Path(__file__).resolve().parents[2]

GRPO = ("algorithm.name=grpo", "trainer.val_before_train=false", "trainer.save_freq=1")


def worker_error(died: bool = True, rank: int = 1) -> WorkerError:
    return WorkerError("boom", role="actor", rank=rank, node="10.0.0.2", pid=42, method="actor.update_actor",
                       died=died)


class Loop:
    """A fake trainer loop whose runs fail at the given steps (7 each unless `steps` is
    given), then returns "done"."""

    def __init__(self, failures: int = 0, restartable: bool = True, steps: list[int] | None = None) -> None:
        self.steps = steps if steps is not None else [7] * failures
        self.restartable = restartable
        self.runs, self.restarts, self.reports = 0, [], []

    def run(self) -> str:
        self.runs += 1
        if self.runs <= len(self.steps):
            raise worker_error()
        return "done"

    def restart(self, failure: Failure, n: int) -> None:
        if not self.restartable:
            raise CannotRestart("no checkpoint")
        self.restarts.append((failure.step, n))

    def supervise(self, max_restarts: int) -> str:
        return supervise(self.run, self.restart, lambda err: Failure.of(err, self.steps[self.runs - 1], "update_actor"),
                         max_restarts, self.reports.append)


def test_supervise_restarts_up_to_the_limit_then_raises_the_last_error():
    loop = Loop(failures=2)
    assert loop.supervise(max_restarts=2) == "done" and loop.restarts == [(7, 1), (7, 2)]
    assert "actor rank 1 (node 10.0.0.2, pid 42) died" in loop.reports[0]

    loop = Loop(failures=3)
    with pytest.raises(WorkerError) as info:
        loop.supervise(max_restarts=2)
    assert loop.runs == 3 and len(loop.restarts) == 2
    assert "step 7, phase update_actor; stopped after 2 restart(s) at that step (trainer.max_restarts=2" in "".join(info.value.__notes__)

    loop = Loop(failures=1)
    with pytest.raises(WorkerError):  # 0: today's behaviour, the first failure stops the run
        loop.supervise(max_restarts=0)
    assert loop.restarts == []


def test_a_failure_at_the_same_step_counts_toward_the_limit_and_stops_with_the_last_error():
    loop = Loop(steps=[5, 5, 5])
    with pytest.raises(WorkerError) as info:
        loop.supervise(max_restarts=2)
    notes = "".join(info.value.__notes__)
    assert loop.restarts == [(5, 1), (5, 2)]
    assert "the failure was in step 5, phase update_actor; stopped after 2 restart(s) at that step" in notes

    loop = Loop(steps=[6, 4, 4])  # an earlier step (the restart went back further) did not get past step 6
    with pytest.raises(WorkerError):
        loop.supervise(max_restarts=2)
    assert loop.restarts == [(6, 1), (4, 2)]


def test_a_failure_at_a_later_step_gets_a_fresh_budget():
    # Each restart got past the step that failed before: the run is progressing, so it
    # goes on (bounded: a fresh budget needs a later step) and finishes.
    loop = Loop(steps=[3, 4, 6])
    assert loop.supervise(max_restarts=1) == "done" and loop.restarts == [(3, 1), (4, 2), (6, 3)]
    assert "restarting the workers (1 of trainer.max_restarts=1 at step 6; 3 in the run)" in loop.reports

    loop = Loop(steps=[3, 4, 4])  # ... but step 4's budget is spent by its own repeat
    with pytest.raises(WorkerError) as info:
        loop.supervise(max_restarts=1)
    assert loop.restarts == [(3, 1), (4, 2)] and "in step 4, phase update_actor; stopped after 1 restart(s)" in "".join(info.value.__notes__)


def test_supervise_without_a_checkpoint_raises_the_worker_error_saying_why():
    loop = Loop(failures=1, restartable=False)
    with pytest.raises(WorkerError) as info:
        loop.supervise(max_restarts=2)
    assert "not restarted: no checkpoint" in "".join(info.value.__notes__)


def test_supervise_never_retries_the_controllers_own_errors():
    calls = []

    def run() -> None:
        calls.append(1)
        raise ValueError("a bug in the loop")

    with pytest.raises(ValueError):
        supervise(run, lambda f, n: None, lambda e: Failure.of(e, 0, None), 5, print)
    assert len(calls) == 1


def test_failure_names_the_cause():
    assert Failure.of(worker_error(died=True), 3, "gen").cause == "died"
    raised = WorkerError("x", role="critic", rank=0, node="n", pid=1, method="critic.update_critic", died=False,
                         remote_traceback="Traceback ...\n  File x\nRuntimeError: CUDA out of memory\n")
    failure = Failure.of(raised, 3, "update_critic")
    assert (failure.cause, failure.error) == ("raised", "RuntimeError: CUDA out of memory")
    hung = CallTimeoutError("actor.gen: ranks 0, 1 did not finish", role="actor", late_ranks=[0, 1], node="n",
                            pid=1, method="actor.generate_sequences", timeout_s=5)
    assert Failure.of(hung, 3, "gen").cause == "timeout" and isinstance(hung, TimeoutError)
    record = failure.record(restarts=1, resumed_step=2)
    assert record["restart/failed_step"] == 3 and record["restart/resumed_step"] == 2
    json.dumps(record)  # a metrics.jsonl line


def test_fault_spec_parses_and_fires_once(tmp_path, monkeypatch):
    assert Fault.parse("hang:actor.update_actor:1:2") == Fault("hang", "actor", "update_actor", 1, 2)
    for bad in ("explode:actor.update_actor:1:2", "kill:actor:1:2", "kill:actor.x:one:2", "kill:actor.x:1:0"):
        with pytest.raises(ValueError, match="ACTION:ROLE.METHOD:RANK:CALL"):
            Fault.parse(bad)
    monkeypatch.delenv("HYBRIDFLOW_FAULT", raising=False)
    monkeypatch.delenv("HYBRIDFLOW_TRACE_REQUEST", raising=False)  # set by any run of this process
    assert fault_runtime_env() == {}
    monkeypatch.setenv("HYBRIDFLOW_FAULT", f"raise:actor.update_actor:0:2:{tmp_path / 'once'}")
    assert fault_runtime_env() == {"runtime_env": {"env_vars": {"HYBRIDFLOW_FAULT": os.environ["HYBRIDFLOW_FAULT"]}}}
    other_rank = FaultInjector(rank=1)
    for _ in range(3):
        other_rank.before_call("actor", "update_actor")  # not its rank: never fires
    injector = FaultInjector(rank=0)
    injector.before_call("actor", "update_actor")
    injector.before_call("actor", "generate_sequences")  # other methods do not count
    with pytest.raises(RuntimeError, match="injected fault"):
        injector.before_call("actor", "update_actor")
    again = FaultInjector(rank=0)  # a restarted process counts again, but the file says it fired
    again.before_call("actor", "update_actor")
    again.before_call("actor", "update_actor")


# Each starts 2-rank GRPO workers twice (or waits for the call timeout): slow.
@pytest.mark.slow
def test_a_worker_error_repeating_at_the_same_step_stops_after_max_restarts_with_the_last_error(
        ray_local, tiny_config, monkeypatch):
    # A deterministic crash at step 2: a run checkpointed at step 1 resumes with every
    # actor process raising in its first update, which is step 2 each time. The restart
    # repeats step 2, fails there again and the run stops (trainer.max_restarts=1).
    monkeypatch.delenv("HYBRIDFLOW_FAULT", raising=False)
    with RLTrainer(tiny_config(*GRPO, "trainer.total_steps=1")) as first:
        first.train()
    run_dir = first.run_dir
    monkeypatch.setenv("HYBRIDFLOW_FAULT", "raise:actor.update_actor:0:1")
    point = resume_point(run_dir, None, ["trainer.total_steps=3", "trainer.max_restarts=1"])
    trainer = RLTrainer(resume=point)
    with trainer, pytest.raises(WorkerError) as info:
        trainer.train()
    err = info.value
    notes = "".join(err.__notes__)
    assert "injected fault" in str(err) and (err.role, err.rank, err.died) == ("actor", 0, False)
    assert "in step 2, phase update_actor; stopped after 1 restart(s) at that step (trainer.max_restarts=1" in notes
    assert [r["step"] for r in rl_records(run_dir)] == [1]
    restarts = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["phase"] == "restart"]
    assert [(r["step"], r["restart/failed_step"], r["restart/cause"]) for r in restarts] == [(1, 2, "raised")]
    assert read_status(run_dir)["state"] == "failed" and read_status(run_dir)["restarts"] == 1


@pytest.mark.slow
def test_a_rank_hanging_in_a_collective_is_caught_by_the_call_timeout(ray_local, tiny_config, monkeypatch):
    # Actor rank 1 sleeps instead of its first update; rank 0 waits for it inside the
    # update's collectives. The timeout is far above a tiny model's calls on a loaded machine.
    monkeypatch.setenv("HYBRIDFLOW_FAULT", "hang:actor.update_actor:1:1")
    trainer = RLTrainer(tiny_config(*GRPO, "trainer.max_restarts=0", "trainer.call_timeout_s=60"))
    with trainer, pytest.raises(CallTimeoutError) as info:
        trainer.train()
    err = info.value
    assert err.method == "actor.update_actor" and 1 in err.late_ranks and err.timeout_s == 60
    assert "the failure was in step 1, phase update_actor" in "".join(err.__notes__)
    hung = [w["pid"] for w in read_status(trainer.run_dir)["workers"] if w["role"] == "actor"]
    assert len(hung) == 2
    # Shutting the run down killed the hung processes (ray.kill); give the OS a moment to reap them.
    for _ in range(100):
        if not any(_alive(pid) for pid in hung):
            break
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in hung)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


@pytest.mark.slow
def test_hybridflow_train_reports_a_killed_worker_in_one_paragraph(tmp_path):
    # The CLI end to end (its own embedded Ray): actor rank 1 is killed (SIGKILL) in its
    # first update, max_restarts=0. The user sees the controller's paragraph and the step,
    # phase and run directory; not a traceback, not Ray's out-of-memory guess.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "HYBRIDFLOW_FAULT": "kill:actor.update_actor:1:1"}
    cmd = [sys.executable, "-m", "hybridflow.cli", "train", *TINY, *GRPO, f"trainer.output_dir={tmp_path / 'runs'}",
           "trainer.max_restarts=0"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stderr
    report = [line for line in proc.stderr.splitlines() if not re.match(r"\d{4}-\d\d-\d\d ", line)]  # Ray's log lines
    assert re.fullmatch(r"hybridflow train: actor rank 1 \(node 127\.0\.0\.1, pid \d+\) died during "
                        r"actor\.update_actor: its process exited or was killed from outside .* `hybridflow train "
                        r"--resume RUN_DIR`\..*", report[0])
    assert report[1] == "the failure was in step 1, phase update_actor; stopped after 0 restart(s) at that step " \
                        "(trainer.max_restarts=0: a failure that does not get past the step of the previous one " \
                        "counts toward it)"
    run_dir = next((tmp_path / "runs").iterdir())
    assert report[2] == f"the run directory: {run_dir}"
    assert report[3:] == ["(run again with --debug for the traceback)"]
    everything = proc.stdout + proc.stderr
    assert "Traceback" not in everything and "A worker died or was killed" not in everything
    assert "OOM killer due to high memory usage" not in everything
