"""The asynchronous modes' step: the algorithm's own program, run next to the data."""

from __future__ import annotations

import queue
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import ray
from ray import cloudpickle  # Ray's own copy: what its task arguments are pickled with

from hybridflow.algorithms.off_policy import staleness_metrics
from hybridflow.config.algorithm import AlgorithmSpec, add_algorithm
from hybridflow.config.schema import RunConfig
from hybridflow.controller import WorkerError
from hybridflow.controller.decorator import registered_methods
from hybridflow.controller.futures import RankInfo, gather
from hybridflow.engines.rollout.partial import POLICY_VERSION
from hybridflow.protocol import DataProto
from hybridflow.rewards.manager import RewardOutput, outcome_metrics
from hybridflow.trainer.programs import phases as P
from hybridflow.trainer.programs.algorithms import AlgoState, step_program
from hybridflow.trainer.observe.metrics import BatchSummary
from hybridflow.trainer.programs.phases import Roles, Step
from hybridflow.workers.rollout import GREEDY_KEY, SCORED_COLUMNS

# Who the task's failures are reported as when no worker call inside it failed.
PROGRAM = RankInfo("step_program", 0, "", None)
# The capabilities of an algorithm's row that the rollout pool serves with the groups.
SERVED_BY_STREAM = ("greedy_baseline", "dynamic_sampling")


@dataclass(frozen=True)
class StreamScores:
    """A rule-based scorer (`kind` reward or cost) whose work the rollout pool already did:
    `score` returns the scores the groups arrived with and the metrics RewardManager.score
    reports, from the per-sample outcomes stored with them (workers/rollout.py,
    SCORED_COLUMNS) and the pool's scoring-process restarts since the last step."""

    kind: str
    restarts: dict[str, float]

    def score(self, batch: DataProto) -> RewardOutput:
        key, prefix = SCORED_COLUMNS[self.kind]
        scores = batch.batch[key]
        # (a step that received no generation call this time has no restarts to report)
        restarts = self.restarts.get(f"{self.kind}/worker_restarts", 0.0)
        metrics = {"reward/mean": float(scores.sum(-1).double().mean()),
                   **outcome_metrics(batch, restarts, prefix=prefix)}
        # The extras and errors went into the per-sample outcome columns, counted in `metrics`.
        return RewardOutput(scores, scores.sum(-1), extra_info={}, errors=[], metrics=metrics)


def train_on_groups(step: Step, roles: Roles, cfg: RunConfig, state: AlgoState, groups: list[ray.ObjectRef],
                    version: int, restarts: dict[str, float]) -> None:
    """Run the algorithm's program on the prompt groups behind `groups` (refs into the
    object store), trained at policy `version`, in a task beside the pools (module
    docstring). Fills step.metrics and step.summary and updates `state`; `restarts`: the
    scoring pools' worker restarts reported by the rollout calls this step received."""
    start = time.perf_counter()
    spec = cfg.algorithm.spec
    _ship_user_module(spec)
    if step.balance_dp:
        _learn_layouts(roles)
    scorers = replace(roles, reward=StreamScores("reward", restarts),
                      cost_fn=StreamScores("cost", restarts) if roles.cost_fn is not None else None)
    # What the pool served: generation itself and the row's capabilities it serves
    served = frozenset(("generate", *(c for c in spec.capabilities if c in SERVED_BY_STREAM)))
    events = _run_program.remote(spec, cfg, scorers, state, step.index, version, step.balance_dp, step.concurrent,
                                 served, *groups)
    try:
        for ref in events:  # each phase's name as it starts (the live status, as in sync mode), then the report
            report = gather([ref], [PROGRAM], f"algorithm.name={spec.name}'s step program")[0]
            if isinstance(report, str) and step.on_phase is not None:
                step.on_phase(report)
    except WorkerError as err:
        raise _program_error(err) from err
    step.metrics.update(report["metrics"])
    state.load_state_dict(report["state"])
    step.summary = BatchSummary(report["data"], report["seq_lens"])
    step.metrics["timing_s/train"] = time.perf_counter() - start


# Never run again by Ray when its process dies: the step's updates may have been applied.
@ray.remote(num_cpus=0, max_retries=0)
def _run_program(spec: AlgorithmSpec, cfg: RunConfig, roles: Roles, state: AlgoState, index: int, version: int,
                 balance_dp: bool, concurrent: bool, served: frozenset[str], *groups: DataProto) -> Iterator[Any]:
    """One step of `spec`'s program on the concatenated `groups` (module docstring, point 2),
    in a thread: yields the name of each phase as the program starts it, then the step's
    report; raises what the program raised."""
    events: queue.SimpleQueue = queue.SimpleQueue()

    def run() -> dict[str, Any]:
        add_algorithm(spec)  # the row in this process (a user's algorithm.module is not imported here)
        greedy = [group.meta_info.pop(GREEDY_KEY) for group in groups if GREEDY_KEY in group.meta_info]
        batch = P.concat_generated(list(groups))
        step = Step(index, DataProto(), balance_dp=balance_dp, concurrent=concurrent, streamed=batch, served=served,
                    streamed_greedy=P.concat_generated(greedy) if greedy else None, on_phase=events.put)
        step.metrics.update(staleness_metrics(batch.batch[POLICY_VERSION], batch.batch["response_mask"], version))
        step_program(spec)(step, roles, cfg, state)
        summary = BatchSummary.of(step.batch)
        return {"metrics": step.metrics, "data": summary.metrics, "seq_lens": summary.seq_lens,
                "state": state.state_dict()}

    def in_thread() -> None:
        try:
            events.put(run())
        except BaseException as err:  # noqa: BLE001 - raised by the task, below
            events.put(err)

    threading.Thread(target=in_thread, name="step_program", daemon=True).start()
    while isinstance(event := events.get(), str):
        yield event
    if isinstance(event, BaseException):
        raise event
    yield event


def _ship_user_module(spec: AlgorithmSpec) -> None:
    """A user's program lives in a module the task's process may not import (a .py file of
    algorithm.module, or a module imported from a path only the controller has): send its
    functions by value. (A built-in row names its program by path; __main__ goes by value anyway.)"""
    module = getattr(spec.program, "__module__", None)
    if module in sys.modules and module != "__main__" and not module.startswith("hybridflow."):
        cloudpickle.register_pickle_by_value(sys.modules[module])


def _learn_layouts(roles: Roles) -> None:
    """Have each group learn how its dp-split methods cut a batch (asked of the workers once,
    then cached), so the copies the task receives do not ask again every step."""
    for group in (roles.actor, roles.critic, roles.cost_critic, roles.reward_model, roles.cost_model):
        for method, spec in registered_methods(group.worker_cls).items() if group is not None else ():
            if spec.dispatch.proto_parts:
                group.dp_parts(method)


def _program_error(err: WorkerError) -> Exception:
    """What the task raised, as sync mode raises it: the WorkerError of a worker-group call
    inside it (it names the role and rank), or the program's own exception (a bug in its
    code is no worker failure: trainer.max_restarts does not retry it, run/recovery.py);
    `err` where the task's process itself failed, or where its inputs were lost (the
    process that produced the groups died: the caller names that death)."""
    cause = getattr(err.__cause__, "cause", None)
    if isinstance(cause, ray.exceptions.ObjectLostError):
        return err
    return cause if isinstance(cause, Exception) else err
