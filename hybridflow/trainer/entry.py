"""`RLTrainer`: the one trainer, for every task kind (language-model post-training and
environment tasks).

    from hybridflow import RLTrainer

    RLTrainer({"algorithm": "PPO", "env": "CartPole-v1"}).train(steps=20000)   # environment steps
    RLTrainer({"algorithm": "SAC", "env": "Pendulum-v1"}).train(steps=2000)    # a second one, same process
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hybridflow.config.loader import user_tree
from hybridflow.errors import ConfigError
from hybridflow.config.tasks import (
    TaskKind,
    read_task_config,
    task_kind_of_checkpoint,
    task_kind_of_config,
)
from hybridflow.trainer.run.stop_signal import swallowed_stop


class RLTrainer:
    """One trainer for every task kind (module docstring)."""

    def __init__(self, config: Any = None, resume: Any = None) -> None:
        resume = None if resume is False else resume  # resume=False: a fresh run, whichever the kind
        self.kind, typed = read_config(config, resume)
        self._scoped = False  # inside `with`: the workers stay up between train() calls
        from hybridflow.trainer.env import part as _env  # noqa: F401  (here: they register their parts
        from hybridflow.trainer.jobs import rm as _rm  # noqa: F401   and import torch and Ray)
        from hybridflow.trainer.lm import part as _lm  # noqa: F401
        from hybridflow.trainer.task import Task

        self.task = Task(self.kind, typed, resume=resume)

    def __enter__(self) -> RLTrainer:
        self._scoped = True
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __getattr__(self, name: str) -> Any:
        # Only called for names RLTrainer itself lacks: the task's config, run_dir, groups...
        if name == "task":
            raise AttributeError(name)
        return getattr(self.task, name)

    def __repr__(self) -> str:
        return f"RLTrainer({self.kind.name}, run_dir={str(getattr(self.task, 'run_dir', None))!r})"

    def setup(self) -> float:
        """Start the workers now (train() does it on first use); the seconds it took, 0.0 when
        they run already: time training without the start-up."""
        return self.task.setup()

    def train(self, steps: int | float | None = None) -> Any:
        """`steps` more steps (RL steps of a language-model run, environment steps of an
        environment task; an integral float such as 1e5 is fine); None: on to the config's
        total. Outside `with`, the workers are released before it returns."""
        try:
            result = self.task.train(None if steps is None else as_steps(steps))
        except BaseException as err:
            from hybridflow.controller.errors import WorkerError  # here: importing entry.py starts no Ray/torch

            if isinstance(err, WorkerError):  # what the worker failure's "--resume RUN_DIR" refers to
                err.add_note(f"hybridflow: the run directory: {self.task.run_dir}")
            if not self._scoped:
                self.task.release(save=False)  # the newest complete checkpoint stays the restart point
            stop = swallowed_stop(err)
            if stop is not None:  # a signal's stop, which Ray turned into its own SystemExit(1)
                raise stop from None
            raise
        if not self._scoped:
            self.task.release(save=True)
        return result

    def close(self) -> None:
        """Stop the workers (and Ray, when this trainer started it); close the loggers."""
        self.task.close()


def read_config(config: Any, resume: Any = None) -> tuple[TaskKind, Any]:
    """The task kind and the typed config of what RLTrainer was given (module docstring).
    A YAML path is read once; a dict or file tree gets the top-level key check first; a run
    to resume must be of the config's kind."""
    if isinstance(config, (str, Path)):
        config = user_tree(config)
    if isinstance(config, dict):
        kind, typed = read_task_config(config)
    elif config is not None:
        kind, typed = task_kind_of_config(config), config
        if kind is None:
            raise TypeError(f"RLTrainer needs a config: a dict, a YAML path or a typed config (RunConfig), "
                            f"got {type(config).__name__}")
    elif resume is None:
        raise TypeError("RLTrainer needs a config (a dict, a YAML path or a typed config) or resume=<run dir>")
    elif isinstance(resume, (str, Path)):
        return kind_of_run(resume), None
    else:
        kind = task_kind_of_config(getattr(resume, "cfg", None))  # a worked-out resume point carries its config
        if kind is None:
            raise TypeError(f"resume is a run directory, a checkpoint directory or a resume point, got {resume!r}; "
                            "resume=True (the newest of the config's runs) needs the config")
        return kind, None
    run = getattr(resume, "checkpoint", resume)  # a SavedRun: `hybridflow train --resume RUN` read its config.yaml
    if isinstance(run, (str, Path)) and (ran := kind_of_run(run)) is not kind:
        # Else the run's saved config is read as the other kind's and fails on a key of its own.
        raise ConfigError(f"{str(resume)!r} is a run of task kind {ran.name!r}, the config of kind "
                          f"{kind.name!r}: resume the run with its own config "
                          "(hybridflow train --resume RUN without --config; RLTrainer(resume=RUN)) or start a new run")
    return kind, typed


def kind_of_run(resume: str | Path) -> TaskKind:
    """The task kind of a run (or checkpoint) directory, from its newest checkpoint's record."""
    from hybridflow.trainer.run.checkpointing import find_checkpoint, read_trainer_state

    return task_kind_of_checkpoint(read_trainer_state(find_checkpoint(resume)))


def as_steps(steps: Any) -> int:
    """`steps` as a positive int; integral floats such as 1e6 are accepted."""
    if isinstance(steps, bool) or not isinstance(steps, (int, float)):
        raise TypeError(f"steps must be a number of steps (int, or an integral float like 1e6), got {steps!r}")
    if isinstance(steps, float) and not steps.is_integer():
        raise ValueError(f"steps must be a whole number of steps, got {steps}")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    return int(steps)
