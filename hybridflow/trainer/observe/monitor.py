"""Watching a running job from outside: which worker is where, how busy, in which phase.

    workers = attach("runs/grpo-...")            # from <run>/status.json (observe/live_status.py)
    sampler = Sampler(workers)
    rows = sampler.sample()                       # CPU %, RSS, GPU per worker, now
    report = profile("runs/grpo-...", duration_s=60, interval_s=0.5, out_dir=Path("runs/grpo-.../profile"))
"""

from __future__ import annotations

import functools
import json
import re
import socket
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from hybridflow.controller.tracing import request_trace
from hybridflow.trainer.observe.live_status import TRACE_REQUEST_FILE, read_status, read_timeline

# A worker below this share of one core is idle (waiting for the controller or its peers).
IDLE_CPU_PERCENT = 10.0
IDLE_GPU_PERCENT = 5.0
TRACES_DIR = "traces"
TRACE_WAIT_S = 60.0  # for the traces, which each process writes at its first call after the window


@dataclass(frozen=True)
class WatchedWorker:
    role: str
    rank: int
    pid: int
    node: str
    node_id: str | None = None

    @property
    def label(self) -> str:
        return f"{self.role}/{self.rank}"


@dataclass
class Sample:
    t: float
    worker: str  # WatchedWorker.label
    cpu_percent: float | None  # of one core; None when the process is gone or unreachable
    rss_mb: float | None


@dataclass
class DeviceSample:
    t: float
    device: str
    util_percent: float
    memory_mb: float


def attach(run_dir: str | Path | None = None, address: str | None = None) -> list[WatchedWorker]:
    """The job's workers: from <run>/status.json, or from Ray's list of WorkerHost actors
    at `address`. Raises FileNotFoundError / RuntimeError saying what is missing."""
    if run_dir is not None:
        status = read_status(run_dir)
        if status is None:
            raise FileNotFoundError(f"{str(run_dir)!r} has no status.json: not the directory of a run or job "
                                    "(hybridflow train, sft, rm), or the run has not started yet")
        if status.get("host") == socket.gethostname() and not psutil.pid_exists(status["pid"]):
            # Else its workers were sampled as if alive (a Ray started for nothing, TaskUnschedulableError).
            raise RuntimeError(f"{str(run_dir)!r} is not running: its process (pid {status['pid']}) has exited, "
                               f"last state {status['state']!r} at step {status['step']}; `hybridflow plot` draws "
                               "its metrics")
        return [WatchedWorker(w["role"], w["rank"], w["pid"], w["node"], w.get("node_id")) for w in status["workers"]]
    if address is None:
        raise ValueError("attach needs a run directory or a Ray address")
    return _ray_workers(address)


def _ray_workers(address: str) -> list[WatchedWorker]:
    from ray._private.state import actors as actor_table  # the GCS's table: works without a dashboard

    from hybridflow.controller import init_ray

    init_ray(address=address)
    workers = []
    for actor in actor_table().values():
        if actor.get("ActorClassName") != "WorkerHost" or actor.get("State") != "ALIVE":
            continue
        # Hosts are named hybridflow:<roles>:<rank>:<group> (controller/worker_group.py).
        found = re.fullmatch(r"hybridflow:([^:]+):(\d+):\w+", actor.get("Name") or "")
        role, rank = (found.group(1), int(found.group(2))) if found else ("worker", len(workers))
        node_id = actor["Address"]["NodeID"]
        workers.append(WatchedWorker(role, rank, actor["Pid"], actor["Address"]["IPAddress"], node_id))
    if not workers:
        raise RuntimeError(f"no running hybridflow workers (WorkerHost actors) on the Ray cluster at {address}")
    return sorted(workers, key=lambda w: (w.role, w.rank))


class Sampler:
    """CPU and memory of every watched worker (and GPU devices when present), on demand."""

    def __init__(self, workers: list[WatchedWorker], gpu: bool = False) -> None:
        self.workers = workers
        self._local: dict[str, psutil.Process] = {}
        self._remote: dict[str, list[WatchedWorker]] = defaultdict(list)
        for worker in workers:
            proc = _local_process(worker.pid)
            if proc is not None:
                self._local[worker.label] = proc
                proc.cpu_percent(None)  # the first call only starts the measurement
            elif worker.node_id is not None:
                self._remote[worker.node_id].append(worker)
        self.gpu = gpu and _cuda_devices() > 0

    def sample(self) -> tuple[list[Sample], list[DeviceSample]]:
        now = time.time()
        samples = [Sample(now, w.label, *_usage(self._local[w.label])) for w in self.workers if w.label in self._local]
        return samples + self._sample_remote(now), (_sample_gpus(now) if self.gpu else [])

    def _sample_remote(self, now: float) -> list[Sample]:
        if not self._remote:
            return []
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        refs = {node: _remote_usage().options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False))
                .remote([w.pid for w in workers]) for node, workers in self._remote.items()}
        out = []
        for node, ref in refs.items():
            usage = ray.get(ref, timeout=30)
            out += [Sample(now, w.label, *usage.get(w.pid, (None, None))) for w in self._remote[node]]
        return out


def _local_process(pid: int) -> psutil.Process | None:
    """The process `pid` on this machine if it is a Ray worker (a pid from another node
    may exist here as something else)."""
    try:
        proc = psutil.Process(pid)
        return proc if "ray::" in " ".join(proc.cmdline()) or proc.name().startswith("ray::") else None
    except psutil.Error:
        return None


def _remote_usage_fn(pids: list[int]) -> dict[int, tuple[float | None, float | None]]:
    procs = {}
    for pid in pids:
        try:
            procs[pid] = psutil.Process(pid)
            procs[pid].cpu_percent(None)
        except psutil.Error:
            pass
    time.sleep(0.2)
    return {pid: _usage(proc) for pid, proc in procs.items()}


def _usage(proc: psutil.Process) -> tuple[float | None, float | None]:
    """(CPU % of one core since the previous call, RSS MiB) of `proc`; (None, None) once it is gone."""
    try:
        return proc.cpu_percent(None), proc.memory_info().rss / 2**20
    except psutil.Error:
        return None, None


@functools.cache
def _remote_usage() -> Any:
    """`_remote_usage_fn` as a zero-CPU Ray task (made once, when a remote worker is watched)."""
    import ray

    return ray.remote(num_cpus=0)(_remote_usage_fn)


def _cuda_devices() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001 - no usable CUDA: CPU only
        return 0


def _sample_gpus(now: float) -> list[DeviceSample]:
    import torch

    out = []
    for i in range(torch.cuda.device_count()):
        try:
            util = float(torch.cuda.utilization(i))
        except Exception:  # noqa: BLE001 - needs NVML (pynvml); report memory alone
            util = float("nan")
        free, total = torch.cuda.mem_get_info(i)
        out.append(DeviceSample(now, f"cuda:{i}", util, (total - free) / 2**20))
    return out


# ----------------------------------------------------------------------------- profile report


@dataclass
class ProfileReport:
    start: float
    end: float
    interval_s: float
    phases: dict[str, float]  # phase -> seconds in the window
    role_cpu: dict[str, dict[str, float]]  # phase -> role -> mean CPU % of its workers
    workers: dict[str, dict[str, float]]  # label -> busy_s, idle_s, mean_cpu, peak_rss_mb
    devices: dict[str, dict[str, float]] = field(default_factory=dict)  # cuda:i -> busy_s, idle_s, mean_util
    steps: int = 0
    overhead: dict[str, float] = field(default_factory=dict)  # the monitor's own CPU use
    traces: dict[str, str] = field(default_factory=dict)  # label -> torch profiler trace (under out_dir)
    dtype: str | None = None  # the run's resolved dtypes (config.yaml), e.g. "actor fp32, rollout fp32"


def run_dtypes(run_dir: str | Path | None) -> str | None:
    """The run's resolved dtypes from its config.yaml ("actor fp32, rollout fp32, ..."), None if unreadable."""
    import yaml

    from hybridflow.config.dtypes import dtype_summary

    if run_dir is None:
        return None
    try:
        tree = yaml.safe_load((Path(run_dir) / "config.yaml").read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None
    return dtype_summary(tree) if isinstance(tree, dict) else None


def run_ended(run_dir: str | Path) -> bool:
    """Whether the run wrote its last status (finished or failed)."""
    return (read_status(run_dir) or {}).get("state") in ("finished", "failed")


def phase_intervals(events: list[dict[str, Any]], start: float, end: float) -> list[tuple[float, float, str]]:
    """(from, to, phase) of the timeline, clipped to [start, end]; gaps between steps
    (logging, checkpoint bookkeeping) are "other", and no phase (before, between runs) is dropped."""
    out = []
    for event, nxt in zip(events, events[1:] + [{"t": end}]):
        lo, hi = max(event["t"], start), min(nxt["t"], end)
        if hi > lo and event.get("phase"):
            out.append((lo, hi, event["phase"]))
    return out


def _phase_at(intervals: list[tuple[float, float, str]], t: float) -> str | None:
    return next((name for lo, hi, name in intervals if lo <= t < hi), None)


def summarize(samples: list[Sample], devices: list[DeviceSample], events: list[dict[str, Any]], roles: dict[str, str],
              start: float, end: float, interval_s: float) -> ProfileReport:
    intervals = phase_intervals(events, start, end)
    phases: dict[str, float] = defaultdict(float)
    for lo, hi, name in intervals:
        phases[name] += hi - lo
    by_phase_role: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    workers: dict[str, dict[str, Any]] = {}
    for s in samples:
        if s.cpu_percent is None:
            continue
        w = workers.setdefault(s.worker, {"busy_s": 0.0, "idle_s": 0.0, "cpu": [], "peak_rss_mb": 0.0})
        w["busy_s" if s.cpu_percent >= IDLE_CPU_PERCENT else "idle_s"] += interval_s
        w["cpu"].append(s.cpu_percent)
        w["peak_rss_mb"] = max(w["peak_rss_mb"], s.rss_mb or 0.0)
        name = _phase_at(intervals, s.t)
        if name is not None:
            by_phase_role[name][roles.get(s.worker, "?")].append(s.cpu_percent)
    devs: dict[str, dict[str, Any]] = {}
    for d in devices:
        dev = devs.setdefault(d.device, {"busy_s": 0.0, "idle_s": 0.0, "util": [], "peak_memory_mb": 0.0})
        if d.util_percent == d.util_percent:  # NaN: no utilisation reading (NVML missing), memory only
            dev["busy_s" if d.util_percent >= IDLE_GPU_PERCENT else "idle_s"] += interval_s
            dev["util"].append(d.util_percent)
        dev["peak_memory_mb"] = max(dev["peak_memory_mb"], d.memory_mb)
    steps = len({e["step"] for e in events if start <= e["t"] <= end and e.get("phase")})
    return ProfileReport(
        start, end, interval_s, dict(phases),
        {p: {r: sum(v) / len(v) for r, v in roles_cpu.items()} for p, roles_cpu in by_phase_role.items()},
        {k: {"busy_s": v["busy_s"], "idle_s": v["idle_s"], "mean_cpu_percent": sum(v["cpu"]) / len(v["cpu"]),
             "peak_rss_mb": v["peak_rss_mb"]} for k, v in workers.items()},
        {k: {"busy_s": v["busy_s"], "idle_s": v["idle_s"], "mean_util_percent": sum(v["util"]) / len(v["util"]) if v["util"] else float("nan"),
             "peak_memory_mb": v["peak_memory_mb"]} for k, v in devs.items()},
        steps,
    )


def profile(run_dir: str | Path, duration_s: float, interval_s: float, out_dir: Path, gpu: bool = False,
            workers: list[WatchedWorker] | None = None, trace: bool = False) -> ProfileReport:
    """Sample the run for `duration_s` (or until it finishes or fails), then write
    report.json, report.md and timeline.png into `out_dir`. Follows the run across
    restarts (new worker pids). `trace`: the run's worker processes also record torch
    profiler traces for the window (controller/tracing.py), into `out_dir`/traces."""
    workers = workers if workers is not None else attach(run_dir)
    sampler, own = Sampler(workers, gpu), psutil.Process()
    samples: list[Sample] = []
    devices: list[DeviceSample] = []
    cpu_before, start = own.cpu_times(), time.time()
    if trace:
        request_trace(Path(run_dir) / TRACE_REQUEST_FILE, start + duration_s, out_dir / TRACES_DIR)
    while time.time() - start < duration_s:
        got, devs = sampler.sample()
        samples += got
        devices += devs
        time.sleep(interval_s)
        if run_dir is not None:
            if run_ended(run_dir):
                break
            now = attach(run_dir)
            if {w.pid for w in now} != {w.pid for w in sampler.workers}:
                sampler = Sampler(now, gpu)  # the run restarted its workers
                workers = sorted(set(workers) | set(now), key=lambda w: (w.role, w.rank, w.pid))
    end, cpu_after = time.time(), own.cpu_times()
    events = read_timeline(run_dir) if run_dir is not None else []
    report = summarize(samples, devices, events, {w.label: w.role for w in workers}, start, end, interval_s)
    if trace:
        report.traces = collect_traces(run_dir, workers, out_dir)
    used = (cpu_after.user - cpu_before.user) + (cpu_after.system - cpu_before.system)
    report.overhead = {"monitor_cpu_s": used, "monitor_cpu_share_of_one_core": used / (end - start)}
    report.dtype = run_dtypes(run_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "report.json").write_text(json.dumps(asdict(report), indent=1), encoding="utf-8")
    (out_dir / "report.md").write_text(report_markdown(report), encoding="utf-8")
    plot_timeline(report, samples, phase_intervals(events, start, end), [w.label for w in workers],
                  out_dir / "timeline.png")
    return report


def collect_traces(run_dir: str | Path, workers: list[WatchedWorker], out_dir: Path) -> dict[str, str]:
    """Wait (at most TRACE_WAIT_S, or until the run ended and its processes on this machine
    are gone) for each worker process's trace (tracing.py says when each writes), then
    withdraw the request; label -> file."""
    deadline = time.time() + TRACE_WAIT_S
    folder = out_dir / TRACES_DIR

    def found() -> dict[str, str]:
        by_pid = {int(m.group(1)): f.name for f in folder.glob("*.pt.trace.json")
                  if (m := re.search(r"-pid(\d+)\.pt\.trace\.json$", f.name))}
        return {w.label: f"{TRACES_DIR}/{by_pid[w.pid]}" for w in workers if w.pid in by_pid}

    # A run that ended inside the window has its processes write at shutdown: wait for them too.
    while len(found()) < len(workers) and time.time() < deadline and not (
            run_ended(run_dir) and not any(_local_process(w.pid) for w in workers)):
        time.sleep(0.2)
    (Path(run_dir) / TRACE_REQUEST_FILE).unlink(missing_ok=True)
    return found()


def report_markdown(report: ProfileReport) -> str:
    wall = report.end - report.start
    lines = [f"# Profile: {wall:.1f} s, {report.steps} step(s), a sample every {report.interval_s:g} s", "",
             *([f"dtype: {report.dtype}", ""] if report.dtype else []),
             "## Where the time went, per phase (CPU % of one core, mean over each role's workers)", ""]
    roles = sorted({r for by_role in report.role_cpu.values() for r in by_role})
    lines += ["| phase | seconds | share | " + " | ".join(f"{r} CPU %" for r in roles) + " |",
              "| --- | ---: | ---: | " + " | ".join("---:" for _ in roles) + " |"]
    for name, seconds in sorted(report.phases.items(), key=lambda kv: -kv[1]):
        by_role = report.role_cpu.get(name, {})
        cells = [f"{by_role[r]:.0f}" if r in by_role else "-" for r in roles]  # "-": no sample in the phase
        lines.append(f"| {name} | {seconds:.2f} | {seconds / wall:.0%} | " + " | ".join(cells) + " |")
    outside = wall - sum(report.phases.values())
    lines += [f"| (outside the step phases) | {outside:.2f} | {outside / wall:.0%} | "
              + " | ".join("" for _ in roles) + " |", "",
              f"## Busy and idle time per worker (idle: under {IDLE_CPU_PERCENT:g}% of a core)", "",
              "| worker | busy s | idle s | idle share | mean CPU % | peak RSS MiB |",
              "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for label, w in sorted(report.workers.items()):
        total = w["busy_s"] + w["idle_s"]
        lines.append(f"| {label} | {w['busy_s']:.1f} | {w['idle_s']:.1f} | {w['idle_s'] / max(total, 1e-9):.0%} | "
                     f"{w['mean_cpu_percent']:.0f} | {w['peak_rss_mb']:.0f} |")
    if report.devices:
        lines += ["", f"## Idle time per GPU (idle: under {IDLE_GPU_PERCENT:g}% utilisation)", "",
                  "| device | busy s | idle s | mean util % | peak memory MiB |", "| --- | ---: | ---: | ---: | ---: |"]
        for name, d in sorted(report.devices.items()):
            lines.append(f"| {name} | {d['busy_s']:.1f} | {d['idle_s']:.1f} | {d['mean_util_percent']:.0f} | "
                         f"{d['peak_memory_mb']:.0f} |")
    if report.traces:
        lines += ["", "## Torch profiler traces (chrome://tracing, Perfetto)", "",
                  *(f"- {label}: {path}" for label, path in sorted(report.traces.items()))]
        missing = sorted(set(report.workers) - set(report.traces))
        if missing:  # e.g. killed, or still in the call in which the window ended
            lines.append(f"- no trace from {', '.join(missing)} within {TRACE_WAIT_S:g} s")
    lines += ["", f"Monitor's own CPU: {report.overhead.get('monitor_cpu_share_of_one_core', 0):.1%} of one core."]
    return "\n".join(lines) + "\n"


def plot_timeline(report: ProfileReport, samples: list[Sample], intervals: list[tuple[float, float, str]],
                  labels: list[str], path: Path) -> None:
    """One row for the controller's phases, one per worker: coloured by phase where the
    worker was busy, grey where it was idle."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = sorted({name for _, _, name in intervals})
    colours = {name: plt.get_cmap("tab20")(i % 20) for i, name in enumerate(names)}
    rows = ["phase (controller)", *labels]
    fig, ax = plt.subplots(figsize=(12, 1.2 + 0.45 * len(rows)))
    t0 = report.start
    for lo, hi, name in intervals:
        ax.broken_barh([(lo - t0, hi - lo)], (len(rows) - 1 - 0.4, 0.8), color=colours[name])
    for row, label in enumerate(labels):
        y = len(rows) - 2 - row
        for s in (s for s in samples if s.worker == label and s.cpu_percent is not None):
            busy = s.cpu_percent >= IDLE_CPU_PERCENT
            colour = colours.get(_phase_at(intervals, s.t), "tab:blue") if busy else "lightgrey"
            ax.broken_barh([(s.t - t0 - report.interval_s, report.interval_s)], (y - 0.4, 0.8), color=colour)
    ax.set_yticks(range(len(rows)), list(reversed(rows)))
    ax.set_xlim(0, report.end - t0)
    ax.set_xlabel("seconds since the profile started")
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours[n]) for n in names]
    handles.append(plt.Rectangle((0, 0), 1, 1, color="lightgrey"))
    ax.legend(handles, [*names, "idle"], loc="upper center", bbox_to_anchor=(0.5, -0.45), ncol=min(8, len(names) + 1),
              fontsize=8)
    ax.set_title("phases per worker (grey: idle)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
