"""Stopping a run cleanly on SIGTERM (what `timeout`, a scheduler or a job runner sends) or
SIGINT (Ctrl-C), for every task kind (language-model runs, environment tasks).

    STOP.install()                 # once Ray is up: Ray's own handler aborts the process
    with STOP.deferred():          # while steps run: finish the current one first
        ...                        # the loop checks STOP.received after each step
    raise RunTerminated(...)       # the CLI prints its one line and exits 128 + the signal
"""

from __future__ import annotations

import atexit
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class RunTerminated(SystemExit):
    """The run stopped on a termination signal; the message is the line the CLI prints, the
    exit code 128 + the signal."""

    def __init__(self, text: str, stop: StopSignal | None = None) -> None:
        self.stop = stop if stop is not None else STOP  # the handler that saw the signal
        super().__init__(self.stop.exit_status)
        self.text = text
        self.stop.unreported = self  # printed at exit unless the CLI reported it (or it was caught: `reported`)

    def __str__(self) -> str:
        return self.text

    def reported(self) -> str:
        """The line, now that the caller reports it (nothing more is printed at exit)."""
        if self.stop.unreported is self:
            self.stop.unreported = None
        return self.text


class StopSignal:
    """The process's SIGTERM / SIGINT handler and what it has seen (one instance: `STOP`)."""

    def __init__(self) -> None:
        self.signum: int | None = None  # the first signal of the steps running now
        self.unreported: RunTerminated | None = None
        self._defer = False
        self._at_exit = False

    @property
    def received(self) -> bool:
        return self.signum is not None

    @property
    def name(self) -> str:
        return signal.Signals(self.signum or signal.SIGTERM).name

    @property
    def exit_status(self) -> int:
        return 128 + int(self.signum or signal.SIGTERM)

    def install(self) -> None:
        """Handle SIGTERM and SIGINT here (main thread only; elsewhere a no-op). Call after
        `ray.init`, which installs a handler of its own that aborts the process."""
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in SIGNALS:
            signal.signal(signum, self._handle)
        if not self._at_exit:
            atexit.register(self._report_at_exit)
            self._at_exit = True

    @contextmanager
    def deferred(self) -> Iterator[None]:
        """While inside, a first signal is only recorded (the caller checks `received`).
        Entering starts afresh: a signal that stopped an earlier train() call is over."""
        self.signum, self.unreported, self._defer = None, None, True
        try:
            yield
        finally:
            self._defer = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._defer and self.signum is None:
            self.signum = signum  # the step in progress finishes first
            return
        if signum == signal.SIGINT and self.signum is None:
            raise KeyboardInterrupt  # Ctrl-C outside a run's steps: what it is in any program
        self.signum = self.signum or signum
        raise RunTerminated(f"stopped by {self.name} (the step in progress was abandoned)", self)

    def _report_at_exit(self) -> None:
        """The line of a RunTerminated nobody reported (a script that let it end the process)."""
        if self.unreported is not None:
            print(f"hybridflow: {self.unreported.reported()}", file=sys.stderr, flush=True)


STOP = StopSignal()


def swallowed_stop(err: BaseException) -> RunTerminated | None:
    """The RunTerminated that `err` replaced, if any: Ray turns an exception raised by a
    signal handler while it waits (ray.get, ray.wait) into a SystemExit(1) of its own."""
    if isinstance(err, SystemExit) and not isinstance(err, RunTerminated):
        return STOP.unreported
    return None


def stopped_line(step: int, checkpoint: Path | None, run_dir: Path, unit: str = "step") -> str:
    """What the CLI prints when a run stops on a signal after `step` (an RL step, or an
    environment task's iteration: `unit`)."""
    kept = (f"checkpoint {checkpoint}" if checkpoint is not None else "no checkpoint yet")
    return (f"stopped by {STOP.name} after {unit} {step}; {kept}; continue with "
            f"`hybridflow train --resume {run_dir}`")
