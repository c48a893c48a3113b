"""`Task`: the one lifecycle of every task kind, what `RLTrainer` (entry.py) runs.

Set-up, the step loop, checkpoints, SIGTERM, the live status, automatic restart (the
supervisor, run/recovery.py) and release are written once, here. What differs per kind is
its part (`TaskPart`, registered in `TASK_PARTS` under the kind's name, or named by a job):
how its run opens (data, reward and tokenizer vs environments), the roles and state it
builds, what one step runs and records, what its checkpoint holds, what `train` returns
(lm/part.py: language models; env/part.py: environments; jobs/sft.py and jobs/rm.py: the
supervised fine-tuning and reward-model jobs, which restart the same way).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Protocol

from hybridflow.config import ConfigError
from hybridflow.config.tasks import TaskKind
from hybridflow.controller import WorkerError, WorkerGroup, network
from hybridflow.registry import Registry
from hybridflow.trainer.observe.live_status import LiveStatus
from hybridflow.trainer.programs.phases import Roles, Step
from hybridflow.trainer.run.checkpointing import (
    CHECKPOINTS_DIR,
    begin_checkpoint,
    checkpoint_step,
    commit_checkpoint,
    complete_checkpoints,
    controller_rng_state,
    read_trainer_state,
    set_controller_rng_state,
)
from hybridflow.trainer.run.lifecycle import ResumePoint, configured_resume
from hybridflow.trainer.run.recovery import RESTART_PHASE, CannotRestart, Failure, supervise
from hybridflow.trainer.run.run_dir import discard_unused_run_dir
from hybridflow.trainer.run.stop_signal import STOP, RunTerminated, stopped_line
from hybridflow.workers import shutdown_role_groups


class TaskPart(Protocol):
    """What one task kind declares (module docstring); `task` is the Task running it."""

    unit: str  # what a global step is called in messages: "step", "iteration"
    phase: str  # the metrics.jsonl phase of its step records ("rl", "sft", "rm")
    # Optional: trainer_state.json's "kind" of a job's checkpoints (default: its TaskKind's).

    def resume_point(self, resume: Any, config: Any) -> ResumePoint: ...
    def open(self, cfg: Any, resume_from: Any) -> Any: ...  # the run's context: cfg, run_dir, log, display, ray
    def restart_config(self, cfg: Any, lost_node: str | None) -> Any: ...
    def start(self, task: Task) -> None: ...  # task.groups, task.roles, task.state (fresh)
    def steps_left(self, task: Task) -> int: ...
    def begin(self, task: Task, steps: int) -> int: ...  # before the loop; the progress to reach
    def progress(self, task: Task) -> int: ...
    def show(self, task: Task, end: int) -> None: ...  # the console's progress display, to `end`
    def step(self, task: Task) -> Step: ...  # one step of the program (its phases tell task.status)
    # The step's record (None: nothing to log this step), shown on the console; sets task.stopped
    # to why the run stops early, if it does.
    def record(self, task: Task, step: Step, before: int, end: int) -> dict[str, float] | None: ...
    def save_due(self, task: Task, before: int) -> bool: ...
    def save(self, task: Task, directory: Path) -> dict[str, Any]: ...
    def load(self, task: Task, checkpoint: Path, state: dict[str, Any]) -> None: ...
    def finish(self, task: Task, record: dict[str, float]) -> Any: ...
    def release(self, task: Task) -> None: ...


TASK_PARTS: Registry[type] = Registry("task part")


class Task:
    """Validates the config and creates (or reopens) the run directory at construction;
    starts the workers on the first `train` call. `release` stops them (after a checkpoint),
    `close` ends the run."""

    def __init__(self, kind: TaskKind, config: Any = None, resume: Any = None, part: str | None = None) -> None:
        self.kind = kind
        self.part: TaskPart = TASK_PARTS[part or kind.name]()
        self.resumed_from: Path | None = None  # the checkpoint the workers start from next
        self.global_step = 0
        if isinstance(resume, ResumePoint) and config is not None:
            raise ValueError("a ResumePoint carries its config; pass config=None with it")
        resume_from = None
        if resume is None and config is not None:
            resume = configured_resume(config)  # trainer.resume: auto / a path; None: a fresh run
        if resume is not None:
            point = resume if isinstance(resume, ResumePoint) else self.part.resume_point(resume, config)
            self.resumed_from, config, self.global_step = point.checkpoint, point.cfg, point.step
            resume_from = point.saved  # its config.yaml is not read again
        self.ctx = self.part.open(config, resume_from)
        STOP.install()  # after Ray's own SIGTERM handler (opening may start Ray), which aborts
        self.config = self.ctx.cfg  # resolved: as saved in <run>/config.yaml
        self.run_dir: Path = self.ctx.run_dir
        self.status = LiveStatus(self.run_dir)
        if self.resumed_from is not None:
            how = "" if self.config.trainer.resume == "never" else f" (trainer.resume={self.config.trainer.resume})"
            self.ctx.display.message(f"resuming from {self.resumed_from} ({self.part.unit} {self.global_step}){how}")
        self.groups: dict[str, WorkerGroup] = {}
        self.roles: Roles | None = None
        self.state: Any = None  # what the program carries across steps (AlgoState, EnvRun)
        self.released_at: Path | None = None  # the checkpoint `release` wrote, which the next start loads
        self.stopped: str | None = None

    def __getattr__(self, name: str) -> Any:
        # The part's own attributes (loader, async_runner, ...) read through.
        if name == "part":
            raise AttributeError(name)
        return getattr(self.part, name)

    # ------------------------------------------------------------------ start and stop

    def setup(self) -> float:
        """Start the workers (RLTrainer.setup); the seconds it took, 0.0 when they run already."""
        if self.roles is not None:
            return 0.0
        tick = time.perf_counter()
        self._start()
        return time.perf_counter() - tick

    def _start(self) -> None:
        if self.resumed_from is None:
            self.global_step = 0  # a start from scratch (also after a failure before the first checkpoint)
        self.part.start(self)
        self.status.workers(self.groups)
        for line in network.unreported([i for group in self.groups.values() for i in group.worker_info]):
            self.ctx.display.message(line)  # where the collectives of a multi-node run bind (controller/network.py)
        if self.resumed_from is not None:
            self._load_checkpoint(self.resumed_from)

    def release(self, save: bool) -> None:
        """Stop the workers and release their placement groups (the run directory and Ray
        stay, though a later trainer needing more CPUs may restart Ray: controller RayHold);
        with `save`, checkpoint the current step first (unless it is saved already), so the
        next `train` continues from it as `--resume` would."""
        if self.roles is None:
            return
        state = self.status.data["state"]  # how train() ended (its checkpoint here is no new phase of it)
        newest = complete_checkpoints(self.run_dir / CHECKPOINTS_DIR)
        if save and self.global_step > 0:
            self.released_at = (newest[-1] if newest and checkpoint_step(newest[-1]) == self.global_step
                                else self.save_checkpoint())
            self.resumed_from = self.released_at
        elif newest:  # a failed call: the next start goes back to the newest complete checkpoint
            self.released_at = self.resumed_from = newest[-1]
            self.global_step = checkpoint_step(newest[-1])
        self._stop_workers()
        if self.ctx.ray is not None:  # an environment run in the controller's process has none
            self.ctx.ray.idle()
        self.status.update(state=state, phase=None)

    def _stop_workers(self, keep_state: bool = False) -> None:
        try:
            self.part.release(self)
        finally:
            shutdown_role_groups(self.groups)
            self.groups, self.roles = {}, None
            if not keep_state:  # a later start builds it afresh and loads the checkpoint's
                self.state = None

    def close(self) -> None:
        """Stop the workers and (if this run started it) Ray; close the loggers. The state the
        program carried (trainer.state: a Lagrange multiplier, environment steps) stays readable."""
        self._stop_workers(keep_state=True)
        self.status.close()
        self.ctx.close()
        if self.resumed_from is None and self.global_step == 0:
            discard_unused_run_dir(self.run_dir)  # a start that failed leaves no empty run dir

    def just_resumed(self) -> bool:
        """Whether this start continues a checkpoint of an earlier start of the run (a resume,
        not a `release` of this one), not yet stepped: its evaluation "before" is the run's
        step-0 record in metrics.jsonl, not evaluated (and logged) again."""
        return (self.resumed_from is not None and self.resumed_from != self.released_at
                and self.global_step == checkpoint_step(self.resumed_from))

    # ------------------------------------------------------------------ the loop

    def train(self, steps: int | None = None) -> Any:
        """`steps` more steps of the kind's unit (None: on to the config's total)."""
        if steps is None:  # RLTrainer.train checked a given one (as_steps)
            steps = self.part.steps_left(self)
        setup_s = self.setup()
        end = self.part.begin(self, steps)
        try:
            with STOP.deferred():  # a SIGTERM lets the step in progress finish (run/stop_signal.py)
                record = supervise(lambda: self._run_steps(end), self._restart, self._failure,
                                   self.config.trainer.max_restarts, report=self.ctx.display.message)
        except BaseException:
            self.status.update(state="stopped" if STOP.received else "failed")
            raise
        self.status.update(state="finished", phase=None)
        result = self.part.finish(self, record)
        if hasattr(result, "setup_s"):
            result.setup_s = setup_s
        return result

    def _run_steps(self, end: int) -> dict[str, float]:
        """Steps until the part's progress reaches `end`; the last record."""
        part, ctx = self.part, self.ctx
        part.show(self, end)
        last: dict[str, float] = {}
        while part.progress(self) < end:
            before = part.progress(self)
            self.global_step += 1
            self.status.update(step=self.global_step)
            step = part.step(self)
            record = part.record(self, step, before, end)
            if record is not None:
                ctx.log.write(part.phase, self.global_step, record)
                last = record
            if part.save_due(self, before):  # after the log: a checkpoint's steps are all logged
                self.save_checkpoint()
            self.status.update(steps_done=self.status.data["steps_done"] + 1)
            if STOP.received:
                ctx.display.stop()
                raise RunTerminated(stopped_line(self.global_step, self._checkpoint_on_signal(), self.run_dir,
                                                 part.unit))
            if self.stopped is not None:
                ctx.display.message(f"{part.unit} {self.global_step}: {self.stopped}")
                break
        ctx.display.stop()
        return last

    # ------------------------------------------------------------------ restarts

    def _failure(self, err: WorkerError) -> Failure:
        root_cause = getattr(self.part, "root_cause", None)  # the asynchronous modes' rollout pool
        return Failure.of(root_cause(err) if root_cause is not None else err, self.global_step,
                          self.status.current_phase)

    def _restart(self, failure: Failure, restarts: int) -> None:
        """Tear every worker group down (hung processes are killed), then continue from the
        newest complete checkpoint as `--resume` would (run/recovery.py), with the config the
        cluster holds now (an elastic run's world size, run/elastic.py)."""
        group = self.groups.get(failure.role) if failure.cause == "died" else None  # a dead rank's group
        lost_node = group.worker_info[failure.rank]["node_id"] if group is not None else None  # its Ray node
        self._stop_workers()
        checkpoints = complete_checkpoints(self.run_dir / CHECKPOINTS_DIR)
        if not checkpoints:
            raise CannotRestart(f"the run has no complete checkpoint to go back to (trainer.save_freq="
                                f"{self.config.trainer.save_freq}); set trainer.save_freq to checkpoint every N steps")
        self.status.update(state="restarting", restarts=restarts)
        try:
            cfg = self.part.restart_config(self.config, lost_node)
        except ConfigError as err:
            raise CannotRestart(str(err)) from err
        before = getattr(self.config, "resources", None)
        self.ctx = self.ctx.reopen(checkpoints[-1], cfg)
        self.config = self.ctx.cfg
        self.resumed_from, self.global_step = checkpoints[-1], checkpoint_step(checkpoints[-1])
        after = getattr(self.config, "resources", None)
        resized = "" if after == before else (f"; world size {before.world_size} on {before.nodes} node(s) -> "
                                              f"{after.world_size} on {after.nodes}")
        self.ctx.display.message(f"restart {restarts}: resuming from {self.resumed_from} ({self.part.unit} "
                                 f"{self.global_step})" + resized)
        self._start()
        sizes = {} if after is None else {
            "restart/world_size": after.world_size, "restart/nodes": after.nodes,
            "restart/previous_world_size": before.world_size, "restart/previous_nodes": before.nodes}
        self.ctx.log.write(RESTART_PHASE, self.global_step, {**failure.record(restarts, self.global_step), **sizes})

    # ------------------------------------------------------------------ checkpoints

    def save_checkpoint(self) -> Path:
        """Checkpoint the current step into <run>/checkpoints/global_step_<N> (every trained
        role's state, the kind's own state, the controller's RNG), atomically, then keep the
        newest trainer.keep_last_checkpoints."""
        self.status.phase("save_checkpoint")
        tmp = begin_checkpoint(self.run_dir, self.global_step)
        state = {"global_step": self.global_step, **self.part.save(self, tmp), "rng": controller_rng_state()}
        if self._checkpoint_kind is not None:
            state["kind"] = self._checkpoint_kind
        return commit_checkpoint(tmp, state, self.config.trainer.keep_last_checkpoints)

    def _load_checkpoint(self, checkpoint: Path) -> None:
        """Restore what `save_checkpoint` wrote (after the workers and the state exist)."""
        state = read_trainer_state(checkpoint)
        if state.get("kind") != self._checkpoint_kind:
            raise ValueError(f"{str(checkpoint)!r} is not a checkpoint of this kind of run ({type(self.part).__name__})")
        self.part.load(self, checkpoint, state)
        self.global_step = int(state["global_step"])
        set_controller_rng_state(state["rng"])  # last: building the workers drew from it

    @property
    def _checkpoint_kind(self) -> str | None:
        return getattr(self.part, "checkpoint_kind", self.kind.checkpoint_kind)

    def _checkpoint_on_signal(self) -> Path | None:
        """The checkpoint a run stopped by SIGTERM leaves: this step's (written now with
        trainer.save_on_signal, unless it is saved already), else the newest there is."""
        found = complete_checkpoints(self.run_dir / CHECKPOINTS_DIR)
        saved = bool(found) and checkpoint_step(found[-1]) == self.global_step
        if self.config.trainer.save_on_signal and not saved:
            return self.save_checkpoint()
        return found[-1] if found else None

