"""The `hybridflow` command.

    hybridflow train [--config FILE] [key=value ...]   RL training (no arguments: the built-in demo)
    hybridflow sft [--config FILE] [key=value ...]     supervised fine-tuning (warm start)
    hybridflow selfcheck [--world-size 4]              start Ray, spawn a gloo group, all-reduce, report

`train` and `sft` read the config tree of hybridflow/config/schema.py: a YAML file plus
dotted overrides such as `actor.optim.lr=1e-5 rollout.n=4`. The config is validated before
any worker starts; the resolved config, metrics.jsonl and models go to the run directory.

Subcommands import their heavy dependencies lazily so `hybridflow --help` stays fast.
"""

from __future__ import annotations

import argparse
import os
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


def _load(args: argparse.Namespace):
    from hybridflow.config import ConfigError
    from hybridflow.config.schema import load_run_config

    try:
        return load_run_config(args.config, args.overrides)
    except ConfigError as err:
        print(f"hybridflow {args.command}: config error: {err}", file=sys.stderr)
        return None


def _print_config(cfg) -> None:
    import yaml

    from hybridflow.config import config_to_dict
    from hybridflow.config.schema import resolve_run_config

    print(yaml.safe_dump(config_to_dict(resolve_run_config(cfg)), sort_keys=False), end="")


def _cmd_train(args: argparse.Namespace) -> int:
    cfg = _load(args)
    if cfg is None:
        return 2
    if args.print_config:
        _print_config(cfg)
        return 0
    from hybridflow.trainer import RLTrainer

    with RLTrainer(cfg) as trainer:
        trainer.train()
    return 0


def _cmd_sft(args: argparse.Namespace) -> int:
    cfg = _load(args)
    if cfg is None:
        return 2
    if args.print_config:
        _print_config(cfg)
        return 0
    if cfg.sft.steps < 1:
        print("hybridflow sft: set sft.steps to the number of fine-tuning steps (>= 1)", file=sys.stderr)
        return 2
    from hybridflow.trainer.sft import run_sft_job

    run_sft_job(cfg)
    return 0


def _add_config_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=None, help="YAML config file (default: the built-in defaults)")
    parser.add_argument("--print-config", action="store_true",
                        help="print the resolved config (every key, YAML) and exit without running")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="dotted overrides applied after the file, e.g. actor.optim.lr=1e-5")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hybridflow", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="RL training (GRPO / PPO); no arguments runs the built-in demo")
    _add_config_arguments(train)
    train.set_defaults(handler=_cmd_train)

    sft = sub.add_parser("sft", help="supervised fine-tuning on prompt/response pairs")
    _add_config_arguments(sft)
    sft.set_defaults(handler=_cmd_sft)

    selfcheck = sub.add_parser("selfcheck", help="check the Ray + torch.distributed runtime")
    selfcheck.add_argument("--world-size", type=int, default=4, help="ranks to spawn (default 4)")
    selfcheck.set_defaults(handler=_cmd_selfcheck)
    return parser


def main(argv: list[str] | None = None) -> int:
    # Per-file "Loading weights" / "Writing model shards" bars from every rank drown the
    # run's own progress display; set before transformers is imported here or in the
    # Ray workers (which inherit this environment). An explicit user setting wins.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    args = build_parser().parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    return handler(args)


if __name__ == "__main__":
    sys.exit(main())
