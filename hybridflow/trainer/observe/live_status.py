"""What a running job is doing now, for `hybridflow monitor` and for failure reports."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from hybridflow.controller import WorkerGroup
from hybridflow.controller.tracing import ENV_VAR as TRACE_ENV_VAR

STATUS_FILE = "status.json"
TRACE_REQUEST_FILE = "trace_request.json"
TIMELINE_FILE = "timeline.jsonl"
STATUS_EVERY_S = 1.0
_TAIL_BYTES = 4096  # the newest timeline line is within the file's last few kilobytes


class LiveStatus:
    """The run's live status (status.json) and phase timeline (timeline.jsonl)."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / STATUS_FILE
        self.data: dict[str, Any] = {"pid": os.getpid(), "host": socket.gethostname(), "state": "starting",
                                     "step": 0, "phase": None, "phase_start": time.time(), "started": time.time(),
                                     "steps_done": 0, "restarts": 0, "workers": []}
        self._timeline = open(run_dir / TIMELINE_FILE, "a", encoding="utf-8", buffering=1)  # noqa: SIM115
        self._written = 0.0
        self._write(force=True)
        # Where `hybridflow monitor --trace` asks for torch profiler traces: the worker
        # processes started from now on look for it (controller/tracing.py).
        os.environ[TRACE_ENV_VAR] = str(run_dir / TRACE_REQUEST_FILE)

    @property
    def current_phase(self) -> str | None:
        return self.data["phase"]

    def workers(self, groups: dict[str, WorkerGroup]) -> None:
        """Record every role's processes (pid, node and network interface per rank)."""
        self.data["workers"] = [{"role": role, "rank": info["rank"], "pid": info["pid"], "node": info["ip"],
                                 "node_id": info["node_id"], "interface": info.get("interface")}
                                for role, group in groups.items() for info in group.worker_info]
        self._write(force=True)

    def phase(self, name: str, step: int | None = None) -> None:
        """A phase starts (of step `step`, default the current one)."""
        if step is not None:
            self.data["step"] = step
        self.data.update(phase=name, phase_start=time.time(), state="training")
        self._mark()
        self._write(force=False)

    def update(self, **fields: Any) -> None:
        state_changed = "state" in fields and fields["state"] != self.data["state"]
        self.data.update(fields)
        if state_changed:
            self.data.update(phase=None, phase_start=time.time())
            self._mark()
        self._write(force=state_changed)

    def close(self) -> None:
        self._write(force=True)
        self._timeline.close()

    def _mark(self) -> None:
        event = {"t": self.data["phase_start"], "step": self.data["step"], "phase": self.data["phase"],
                 "state": self.data["state"]}
        self._timeline.write(json.dumps(event) + "\n")

    def _write(self, force: bool) -> None:
        if not force and time.monotonic() - self._written < STATUS_EVERY_S:
            return
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.data), encoding="utf-8")
        os.replace(tmp, self.path)
        self._written = time.monotonic()


def read_timeline(run_dir: str | Path) -> list[dict[str, Any]]:
    """The events of <run>/timeline.jsonl, oldest first (a line torn by a crash is skipped)."""
    path = Path(run_dir) / TIMELINE_FILE
    if not path.is_file():
        return []
    return _events(path.read_text(encoding="utf-8"))


def read_status(run_dir: str | Path) -> dict[str, Any] | None:
    """The run's status now: status.json with the step, phase and state of the newest
    timeline line when that is newer; None when the trainer never wrote one."""
    path = Path(run_dir) / STATUS_FILE
    try:
        status = json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    latest = _last_event(Path(run_dir) / TIMELINE_FILE)
    if latest is not None and latest["t"] >= status["phase_start"]:
        status.update(step=latest["step"], phase=latest["phase"], phase_start=latest["t"], state=latest["state"])
    return status


def _last_event(path: Path) -> dict[str, Any] | None:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - _TAIL_BYTES))
            events = _events(f.read().decode("utf-8", errors="replace"))
    except FileNotFoundError:
        return None
    return events[-1] if events else None


def _events(text: str) -> list[dict[str, Any]]:
    events = []
    for line in text.splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a torn last line, or the partial first line of a tail
    return events
