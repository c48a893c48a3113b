"""`hybridflow monitor RUN_DIR | --address ADDR [--profile cpu|gpu] [--duration S]`
(also installed as `hybridflow-monitor`).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("monitor", help="live CPU / memory / phase per worker of a running job; --profile "
                                            "writes a report of where the time went")
    configure(parser)
    parser.set_defaults(handler=run_monitor)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", nargs="?", default=None, metavar="RUN_DIR",
                        help="the run directory of a running `hybridflow train` (its status.json)")
    parser.add_argument("--address", default=None, help="a Ray cluster address: watch the hybridflow workers on it")
    parser.add_argument("--profile", choices=("cpu", "gpu"), default=None,
                        help="record for --duration seconds and write a report (gpu: also per-GPU utilisation)")
    parser.add_argument("--duration", type=float, default=None, help="seconds to watch (default: until Ctrl-C; "
                                                                      "60 with --profile)")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between samples (default 0.5)")
    parser.add_argument("--out", default=None, help="where --profile writes its report (default RUN_DIR/profile)")
    parser.add_argument("--trace", action="store_true",
                        help="with --profile and RUN_DIR: the run's worker processes also record torch profiler "
                             "traces for the duration (OUT/traces/*.pt.trace.json; the run pays what torch.profiler "
                             "costs while recording)")


def run_monitor(args: argparse.Namespace) -> int:
    problem = _usage_problem(args)
    if problem:
        print(f"hybridflow monitor: {problem}", file=sys.stderr)
        return 2
    from hybridflow.trainer.observe.monitor import attach, profile

    try:
        workers = attach(args.run_dir, args.address)
    except (FileNotFoundError, RuntimeError) as err:
        print(f"hybridflow monitor: {err}", file=sys.stderr)
        return 2
    if args.profile is not None:
        out = Path(args.out) if args.out else Path(args.run_dir or ".") / "profile"
        report = profile(args.run_dir, args.duration or 60.0, args.interval, out, gpu=args.profile == "gpu",
                         workers=workers, trace=args.trace)
        print(f"profile of {report.end - report.start:.0f} s ({report.steps} steps) written to {out}: report.md, "
              f"report.json, timeline.png; the monitor used {report.overhead['monitor_cpu_share_of_one_core']:.1%} "
              "of one core")
        return 0
    live(args.run_dir, workers, args.interval, args.duration)
    return 0


def _usage_problem(args: argparse.Namespace) -> str | None:
    if (args.run_dir is None) == (args.address is None):
        return "give a run directory or --address ADDR (one of them)"
    if args.run_dir is not None and not Path(args.run_dir).is_dir():
        return f"{args.run_dir!r} is not a directory"
    if args.trace and (args.profile is None or args.run_dir is None):
        return "--trace goes with --profile and a run directory (the request reaches the workers through it)"
    if not args.interval > 0 or (args.duration is not None and not args.duration > 0):
        return "--interval and --duration must be > 0 seconds"
    return None


def live(run_dir: str | None, workers: list, interval_s: float, duration_s: float | None) -> None:
    from rich.console import Console
    from rich.live import Live

    from hybridflow.trainer.observe.monitor import Sampler, run_ended

    sampler, start = Sampler(workers, gpu=True), time.time()
    first = _status(run_dir)
    try:
        with Live(console=Console(), auto_refresh=False) as view:
            while duration_s is None or time.time() - start < duration_s:
                time.sleep(interval_s)
                samples, devices = sampler.sample()
                view.update(_table(workers, samples, devices, _status(run_dir), first, time.time() - start),
                            refresh=True)
                if run_dir is not None and run_ended(run_dir):
                    break
    except KeyboardInterrupt:
        pass


def _status(run_dir: str | None) -> dict | None:
    from hybridflow.trainer.observe.live_status import read_status
    from hybridflow.trainer.observe.monitor import run_dtypes

    status = read_status(run_dir) if run_dir is not None else None
    if status is not None:
        status["dtype"] = run_dtypes(run_dir)
    return status


def _table(workers: list, samples: list, devices: list, status: dict | None, first: dict | None, watched_s: float):
    from rich.table import Table

    title = "hybridflow workers"
    if status is not None:
        elapsed = time.time() - status["phase_start"]
        done = status["steps_done"] - (first or status)["steps_done"]
        title = (f"{status['state']} - step {status['step']}, phase {status['phase'] or '-'} for {elapsed:.1f} s - "
                 f"{done / max(watched_s, 1e-9) * 60:.1f} steps/min - restarts {status['restarts']}")
        if status.get("dtype"):
            title += f"\ndtype: {status['dtype']}"
    table = Table(title=title)
    for column in ("role", "rank", "node", "pid", "CPU %", "RSS MiB"):
        table.add_column(column, justify="right" if column in ("rank", "pid", "CPU %", "RSS MiB") else "left")
    by_label = {s.worker: s for s in samples}
    for w in workers:
        s = by_label.get(w.label)
        cpu = "-" if s is None or s.cpu_percent is None else f"{s.cpu_percent:.0f}"
        rss = "-" if s is None or s.rss_mb is None else f"{s.rss_mb:.0f}"
        table.add_row(w.role, str(w.rank), w.node, str(w.pid), cpu, rss)
    for d in devices:
        table.add_row("gpu", d.device, "", "", f"{d.util_percent:.0f}", f"{d.memory_mb:.0f}")
    return table


def main(argv: list[str] | None = None) -> int:
    """The `hybridflow-monitor` console script: `hybridflow monitor` on its own."""
    parser = argparse.ArgumentParser(prog="hybridflow-monitor", description=__doc__.splitlines()[0])
    configure(parser)
    return run_monitor(parser.parse_args(argv))
