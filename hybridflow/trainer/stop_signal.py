"""Stopping a run cleanly on SIGTERM (what `timeout`, a scheduler or a job runner sends).

    STOP.install()                 # once Ray is up: Ray's own handler aborts the process
    with STOP.deferred():          # while steps run: finish the current one first
        ...                        # the loop checks STOP.received after each step
    raise RunTerminated(...)       # the CLI prints its one line and exits 143

Outside `deferred` (setting up, evaluating) a SIGTERM abandons what is running at once by
raising `RunTerminated` in the main thread. Inside it, the first SIGTERM only records the
signal: the step finishes, the trainer writes a checkpoint if `trainer.save_on_signal`
(the newest complete one is kept either way) and then raises; a second SIGTERM abandons
the step. Either way the trainer's `close` shuts the workers down on the way out, and the
CLI (cli/__init__.py) reports any failure that follows a SIGTERM as the stop it is, with
exit status 143 (128 + SIGTERM), the shell's status of a process ended by that signal.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

EXIT_STATUS = 128 + signal.SIGTERM


class RunTerminated(Exception):
    """The run stopped on a termination signal; the message is the line the CLI prints."""

    def __init__(self, text: str = "stopped by SIGTERM") -> None:
        super().__init__(text)


class StopSignal:
    """The process's SIGTERM handler and what it has seen (one instance: `STOP`)."""

    def __init__(self) -> None:
        self.received = False
        self._defer = False

    def install(self) -> None:
        """Handle SIGTERM here (main thread only; elsewhere a no-op). Call after `ray.init`,
        which installs a handler of its own that aborts the process."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._handle)

    @contextmanager
    def deferred(self) -> Iterator[None]:
        """While inside, a first SIGTERM is only recorded (the caller checks `received`)."""
        self._defer = True
        try:
            yield
        finally:
            self._defer = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        first = not self.received
        self.received = True
        if not (self._defer and first):
            raise RunTerminated("stopped by SIGTERM (the step in progress was abandoned)")


STOP = StopSignal()


def stopped_line(step: int, checkpoint: Path | None, run_dir: Path) -> str:
    """What the CLI prints when a run stops on SIGTERM after `step`."""
    kept = (f"checkpoint {checkpoint}" if checkpoint is not None else "no checkpoint yet")
    return (f"stopped by SIGTERM after step {step}; {kept}; continue with `hybridflow train --resume {run_dir}`")
