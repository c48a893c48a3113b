"""`hybridflow selfcheck`: start Ray, spawn a gloo group, all-reduce, report."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("selfcheck", help="check the Ray + torch.distributed runtime")
    parser.add_argument("--world-size", type=int, default=4, help="ranks to spawn (default 4)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
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
