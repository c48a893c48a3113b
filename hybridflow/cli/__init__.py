"""The `hybridflow` command.

    hybridflow train [--config FILE] [key=value ...]   RL training (no arguments: the built-in demo)
    hybridflow sft [--config FILE] [key=value ...]     supervised fine-tuning (warm start)
    hybridflow selfcheck [--world-size 4]              start Ray, spawn a gloo group, all-reduce, report

`train` and `sft` read the config tree of hybridflow/config/schema.py: a YAML file plus
dotted overrides such as `actor.optim.lr=1e-5 rollout.n=4`. The config is validated before
any worker starts; the resolved config, metrics.jsonl and models go to the run directory.

Each subcommand lives in its own module here (`add_parser(s)` + a handler) and imports its
heavy dependencies lazily so `hybridflow --help` stays fast.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable

from hybridflow.cli import selfcheck, train


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hybridflow", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    for add in (train.add_parsers, selfcheck.add_parser):
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    # Per-file "Loading weights" / "Writing model shards" bars from every rank drown the
    # run's own progress display; set before transformers is imported here or in the
    # Ray workers (which inherit this environment). An explicit user setting wins.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    args = build_parser().parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    return handler(args)

