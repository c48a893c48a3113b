"""Torch profiler traces of the worker processes, on request of `hybridflow monitor --trace`.

    request_trace(request_file, until=time.time() + 60, out_dir=run / "profile" / "traces")
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ENV_VAR = "HYBRIDFLOW_TRACE_REQUEST"


def request_trace(request_file: Path, until: float, out_dir: Path) -> None:
    """Ask the run's worker processes to record until the unix time `until` (atomic write)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = request_file.with_name(request_file.name + ".tmp")
    tmp.write_text(json.dumps({"until": until, "out_dir": str(out_dir)}), encoding="utf-8")
    tmp.replace(request_file)


def trace_file(out_dir: Path, rank: int, pid: int) -> Path:
    return out_dir / f"rank{rank}-pid{pid}.pt.trace.json"


class TraceRecorder:
    """One worker process's side (WorkerHost owns one)."""

    def __init__(self, rank: int) -> None:
        path = os.environ.get(ENV_VAR)
        self.request = Path(path) if path else None
        self.rank = rank
        self._seen: float | None = None  # mtime of the request last acted on
        self._profiler: Any = None
        self._until = 0.0
        self._out: Path | None = None

    def call(self, role: str, method: str) -> contextlib.AbstractContextManager:
        """The context to run `role.method` in: a profiler range while recording."""
        if self.request is None:
            return contextlib.nullcontext()
        if self._profiler is not None and time.time() >= self._until:
            self.finish()
        if self._profiler is None:
            self._maybe_start()
        if self._profiler is None:
            return contextlib.nullcontext()
        return self._recorded(f"{role}.{method}")

    @contextlib.contextmanager
    def _recorded(self, name: str) -> Iterator[None]:
        import torch

        try:
            with torch.profiler.record_function(name):
                yield
        finally:
            if self._profiler is not None and time.time() >= self._until:
                self.finish()  # the window ended during this call

    def _maybe_start(self) -> None:
        try:
            mtime = self.request.stat().st_mtime
        except OSError:
            return
        if mtime == self._seen:
            return
        self._seen = mtime
        try:
            request = json.loads(self.request.read_text(encoding="utf-8"))
            until, out = float(request["until"]), Path(request["out_dir"])
        except (OSError, ValueError, KeyError, TypeError):
            return  # half a file or not ours: the next change is read again
        if time.time() >= until:
            return
        import torch
        from torch.profiler import ProfilerActivity

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        self._profiler = torch.profiler.profile(activities=activities)
        self._profiler.start()
        self._until, self._out = until, out

    def finish(self) -> None:
        """Stop recording and write the trace (nothing when not recording)."""
        profiler, self._profiler = self._profiler, None
        if profiler is None:
            return
        profiler.stop()
        assert self._out is not None
        self._out.mkdir(parents=True, exist_ok=True)
        target = trace_file(self._out, self.rank, os.getpid())
        tmp = target.with_name(target.name + ".tmp")
        profiler.export_chrome_trace(str(tmp))
        tmp.replace(target)  # a reader never sees half a trace


def flush_traces(actors: list[Any], timeout_s: float = 60.0) -> None:
    """Before a group's processes are killed: while a trace is requested (the request file
    this controller names exists), each process writes what it recorded. Best effort: a
    dead or hung process is not waited for beyond `timeout_s`."""
    path = os.environ.get(ENV_VAR)
    if not path or not os.path.exists(path):
        return
    import ray

    refs = [actor.flush_trace.remote() for actor in actors]
    ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
