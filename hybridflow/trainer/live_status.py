"""<run>/status.json: what a running job is doing now, for `hybridflow monitor` and for
failure reports.

The trainer updates it as each phase of a step starts (phases.py calls `LiveStatus.phase`)
and when its worker groups change; every write replaces the file atomically (a reader sees
the old or the new one). Contents:

    {"pid": controller pid, "state": "starting" | "training" | "restarting" | "finished" | "failed",
     "step": global step in flight, "phase": current phase, "phase_start": unix time,
     "started": unix time of the run, "steps_done": steps finished by this process, "restarts": n,
     "workers": [{"role": "actor", "rank": 0, "pid": 1234, "node": "10.0.0.1", "node_id": "..."}, ...]}

Each phase start (and each change of state) is also appended to <run>/timeline.jsonl as
{"t": unix time, "step": n, "phase": name or null, "state": ...}: the exact phase timeline
`hybridflow monitor --profile` reports on. One write and one appended line per phase
(about ten per step, a few hundred bytes): nothing next to a step (measured in
benchmarks/bench_monitor.py).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from hybridflow.controller import WorkerGroup

STATUS_FILE = "status.json"
TIMELINE_FILE = "timeline.jsonl"


class LiveStatus:
    """The run's live status, written to <run>/status.json on every change."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / STATUS_FILE
        self.timeline = run_dir / TIMELINE_FILE
        self.data: dict[str, Any] = {"pid": os.getpid(), "state": "starting", "step": 0, "phase": None,
                                     "phase_start": time.time(), "started": time.time(), "steps_done": 0,
                                     "restarts": 0, "workers": []}
        self._write()

    @property
    def current_phase(self) -> str | None:
        return self.data["phase"]

    def workers(self, groups: dict[str, WorkerGroup]) -> None:
        """Record every role's processes (pid and node per rank)."""
        self.data["workers"] = [{"role": role, "rank": info["rank"], "pid": info["pid"], "node": info["ip"],
                                 "node_id": info["node_id"]}
                                for role, group in groups.items() for info in group.worker_info]
        self._write()

    def phase(self, name: str, step: int | None = None) -> None:
        """A phase starts (of step `step`, default the current one)."""
        if step is not None:
            self.data["step"] = step
        self.data.update(phase=name, phase_start=time.time(), state="training")
        self._write()
        self._mark()

    def update(self, **fields: Any) -> None:
        state_changed = "state" in fields and fields["state"] != self.data["state"]
        self.data.update(fields)
        if state_changed:
            self.data.update(phase=None, phase_start=time.time())
        self._write()
        if state_changed:
            self._mark()

    def _mark(self) -> None:
        event = {"t": self.data["phase_start"], "step": self.data["step"], "phase": self.data["phase"],
                 "state": self.data["state"]}
        with open(self.timeline, "a", encoding="utf-8") as f:
            f.write(json.dumps(event) + "\n")

    def _write(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.data), encoding="utf-8")
        os.replace(tmp, self.path)


def read_timeline(run_dir: str | Path) -> list[dict[str, Any]]:
    """The phase events of <run>/timeline.jsonl, oldest first (a line torn by a crash is skipped)."""
    path = Path(run_dir) / TIMELINE_FILE
    if not path.is_file():
        return []
    events = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events


def read_status(run_dir: str | Path) -> dict[str, Any] | None:
    """The status a running (or finished) trainer wrote; None when it never wrote one."""
    path = Path(run_dir) / STATUS_FILE
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return None
