"""The `hybridflow` command.

    hybridflow selfcheck [--world-size 4]   start Ray, spawn a gloo group, all-reduce, report

Subcommands import their heavy dependencies lazily so `hybridflow --help` stays fast.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable


def _cmd_selfcheck(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from hybridflow.controller import run_selfcheck

    console = Console()
    console.print(f"[bold]hybridflow selfcheck[/bold]: {args.world_size}-rank gloo group on Ray")
    report = run_selfcheck(world_size=args.world_size)
    table = Table(show_header=False)
    for key, value in report.items():
        if key == "ranks":  # one short line per rank instead of a wall of dicts
            value = "\n".join(
                f"rank {r['rank']}: pid {r['pid']} on {r['ip']} ({r['backend']})" for r in value
            )
        table.add_row(str(key), str(value))
    console.print(table)
    ok = bool(report.get("ok"))
    console.print("[green]self-check passed[/green]" if ok else "[red]self-check FAILED[/red]")
    return 0 if ok else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hybridflow", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    selfcheck = sub.add_parser("selfcheck", help="check the Ray + torch.distributed runtime")
    selfcheck.add_argument("--world-size", type=int, default=4, help="ranks to spawn (default 4)")
    selfcheck.set_defaults(handler=_cmd_selfcheck)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    return handler(args)


if __name__ == "__main__":
    sys.exit(main())
