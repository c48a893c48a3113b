"""`hybridflow plot RUN_DIR [--out DIR]`: PNG plots of a run's reward, KL, entropy,
response length and held-out accuracy over RL steps; of an environment run's return,
episode length and losses over environment steps; of an SFT or reward-model job's loss
and accuracy over its steps (default DIR: <run>/plots)."""

from __future__ import annotations

import argparse
import sys


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("plot", help="plot a run's metrics (PNG files)")
    parser.add_argument("run_dir", help="run directory (holding metrics.jsonl)")
    parser.add_argument("--out", default=None, metavar="DIR", help="where the PNG files go (default <run>/plots)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from hybridflow.trainer.observe.plots import plot_run

    try:
        paths = plot_run(args.run_dir, args.out)
    except FileNotFoundError as err:
        print(f"hybridflow plot: {err}", file=sys.stderr)
        return 2
    if not paths:
        print(f"hybridflow plot: {args.run_dir} has no step metrics to plot", file=sys.stderr)
        return 1
    for path in paths:
        print(path)
    return 0
