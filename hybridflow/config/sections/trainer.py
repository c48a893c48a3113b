"""The `trainer` section of the run config: how long, how often to evaluate and save, where the run
goes, what it logs, the mode and the restart policy, for every task kind (the keys only one kind
reads are its own: config/tasks.py). Its run-directory and console settings (`RunOutputSection`)
are reward models' too (config/rm_schema.py).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import Literal

from hybridflow.config.loader import at_least, positive
from hybridflow.errors import ConfigError


# trainer.loggers: where metrics go (hybridflow/trainer/observe/loggers.py).
LOGGER_NAMES = ("console", "jsonl", "tensorboard", "wandb")


def check_run_name(name: str) -> None:
    """The `name` of a run (every job's) becomes a directory name."""
    if not name or "/" in name or name.strip() != name:
        raise ConfigError(f"must be a non-empty directory-safe word, got {name!r}", "name")


@dataclass
class RunOutputSection:
    """Where a run goes and what it shows (the trainer section of every job).

    output_dir / run_dir: runs go to <output_dir>/<name>-<timestamp>/; run_dir picks an
        exact directory instead (it must not exist: a run never overwrites another).
    console: "rich" progress display, "plain" one line per step, or "none".
    """

    output_dir: str = "runs"
    run_dir: str | None = None
    console: Literal["rich", "plain", "none"] = "rich"


@dataclass
class LoopSection(RunOutputSection):
    """Checkpoints and metrics of a training loop (language-model and environment runs):
    RunOutputSection's keys and

    save_freq: checkpoint every this many steps (environment tasks: at the end of every
        iteration that crosses a multiple of this many environment steps; 0: never) into
        <run>/checkpoints/global_step_<N>; `hybridflow train --resume` continues from the
        newest one.
    keep_last_checkpoints: keep only the newest this many checkpoints (null: all).
    save_on_signal: on SIGTERM or SIGINT, finish the current step and checkpoint it before stopping
        (exit status 143 or 130); false: stop after the step with the newest checkpoint there is.
    loggers: where metrics go: "console" (the display; without it nothing is printed),
        "jsonl" (<run>/metrics.jsonl, read by `hybridflow plot`), "tensorboard"
        (<run>/tensorboard), "wandb" (needs `pip install wandb`; honours WANDB_MODE=offline).
        Plots go to <run>/plots.
    wandb_project: the W&B project of the run (the run is named after its directory).
    max_restarts: when a worker process or node dies, a call raises in a worker, or a call
        outlives call_timeout_s, tear every worker group down, start them again, load the
        newest complete checkpoint (save_freq; a failure before the first one stops the
        run) and go on; at most this many times per step (0: stop at the first failure).
        Each restart is a "restart" record in metrics.jsonl. See docs/resilience.md.
    call_timeout_s: longest a worker-group call may run (seconds; null: no limit). A rank
        stuck in a collective its peers never reach is reported (and restarted) after it.
    """

    save_freq: int = 0
    keep_last_checkpoints: int | None = None
    save_on_signal: bool = True
    loggers: list[str] = field(default_factory=lambda: ["console", "jsonl"])
    wandb_project: str = "hybridflow"
    max_restarts: int = 2
    call_timeout_s: float | None = 1800.0

    def __post_init__(self) -> None:
        at_least(self, 0, "save_freq", note="0 = no checkpoints")
        at_least(self, 1, "keep_last_checkpoints", null="keep all")
        at_least(self, 0, "max_restarts", note="0 = stop at the first worker failure")
        positive(self, "call_timeout_s", null="no limit")
        unknown = [name for name in self.loggers if name not in LOGGER_NAMES]
        if unknown or len(set(self.loggers)) != len(self.loggers):
            raise ConfigError(f"must be distinct names from {list(LOGGER_NAMES)}, got {self.loggers}", "loggers")
        if "wandb" in self.loggers and importlib.util.find_spec("wandb") is None:
            raise ConfigError("includes 'wandb' but the wandb package is not installed: `pip install wandb`, or "
                              "remove 'wandb' from trainer.loggers", "loggers")

    def display_mode(self) -> str:
        """What the run's console shows: `console`, or "none" without the "console" logger."""
        return self.console if "console" in self.loggers else "none"


@dataclass
class ValidationSection:
    """Sampling of the held-out evaluation (verl: rollout.val_kwargs); greedy by default.

    do_sample: false = greedy, the most likely token at each position (temperature,
        top_p and top_k are then unused).
    n: responses per prompt; val/accuracy and val/score are means over all of them.
    temperature / top_p / top_k: sampling settings when do_sample is true.
    seed: sampling seed of every evaluation call, so two evaluations of the same policy
        draw the same random numbers (and `hybridflow eval` repeats an in-run evaluation).
    """

    do_sample: bool = False
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int = 0

    def __post_init__(self) -> None:
        at_least(self, 1, "n")
        if self.do_sample and self.temperature <= 0:
            raise ConfigError(f"must be > 0 when do_sample is true, got {self.temperature}", "temperature")
        at_least(self, 0, "seed")


@dataclass
class TrainerSection(LoopSection):
    """The loop: how long, how often to evaluate and save, where the run goes: LoopSection's
    keys (a checkpoint holds models, optimizers, schedules, data position, RNG and algorithm
    state) and

    total_steps: RL steps (one batch of prompts each).
    test_freq: greedy held-out evaluation every this many steps (0: only before and after).
    save_final_model: export the trained actor as a Hugging Face dir (<run>/final_model).
    val_before_train: evaluate the starting policy (logged at step 0) before the first step.
    validation: sampling of the held-out evaluation (greedy by default).
    balance_batch: before each call that splits the batch over dp ranks (log-probs,
        values, updates), swap rows between ranks so each gets a near-equal token count;
        every mini-/micro-batch keeps its samples, so results only change by float order.
    concurrent_phases: true (default): the step programs' independent phases (the actor's
        log-probs and the critics' values; the critics' and the actor's updates) are in flight
        together and run at once where the roles have processes of their own
        (resources.placement: split); a failure names the call that failed first (on a dead
        process, the one it was running); false: each call is waited for before the next
        (same results; trainer/programs/concurrent.py).
    mode: "sync" (every phase waits for the previous one), "one_step_off" or "async"
        (generation on a separate rollout pool, overlapped with training; settings in
        async_rl, docs/async.md).
    max_no_signal_steps: stop the run (cleanly: it is still evaluated and exported) after
        this many steps in a row without learning signal, i.e. every group's advantages 0
        (all responses to each prompt scored alike); null: never stop. Each such step is
        said on the console either way and counted in adv/no_signal_steps.

    Environment tasks count environment steps instead (a step is one iteration):
    total_env_steps: environment steps of the whole run (train() without steps runs to it;
        with linear lr decay it is the horizon). log_freq: a metrics record at the end of
        every iteration that crosses a multiple of this many environment steps (save_freq:
        the same for checkpoints). return_window: episodes in the rolling mean return
        (episode/return_mean_window). target_return: stop once that mean reaches it (null:
        never).
    """

    total_steps: int = 30
    test_freq: int = 10
    save_final_model: bool = True
    val_before_train: bool = True
    validation: ValidationSection = field(default_factory=ValidationSection)
    balance_batch: bool = True
    concurrent_phases: bool = True
    mode: Literal["sync", "one_step_off", "async"] = "sync"
    max_no_signal_steps: int | None = None
    total_env_steps: int = 100_000
    log_freq: int = 1000
    return_window: int = 20
    target_return: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        positive(self, "total_env_steps", "log_freq", "return_window")
        at_least(self, 1, "max_no_signal_steps", null="never stop")
        at_least(self, 1, "total_steps")
        at_least(self, 0, "test_freq", note="0 = only before and after")
