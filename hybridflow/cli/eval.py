"""`hybridflow eval PATH [key=value ...] [--data FILE ...] [--output OUT.json]`: score a
saved policy on prompts and print accuracy and score overall and per data source.

PATH is a run directory (its newest checkpoint), a checkpoint directory
(<run>/checkpoints/global_step_<N>) or a Hugging Face model directory. --data takes
parquet/jsonl files in verl columns; without it a run's held-out prompts are used.
Sampling is trainer.validation (greedy unless overridden, e.g.
`trainer.validation.do_sample=true trainer.validation.n=4`); a checkpoint is scored with
its run's config, so the numbers repeat the run's evaluation at that step. The JSON report
goes only to an explicit --output, which must not exist.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("eval", help="score a checkpoint or model on prompt files (per data source)")
    parser.add_argument("path", help="run directory, checkpoint directory or Hugging Face model directory")
    parser.add_argument("--data", action="append", default=[], metavar="FILE",
                        help="prompt file (parquet/jsonl, verl columns); repeat for several (default: the run's "
                             "held-out prompts)")
    parser.add_argument("--output", default=None, metavar="FILE.json",
                        help="write the report as JSON to this new file (never overwritten)")
    parser.add_argument("--max-samples", type=int, default=None, help="score only the first N prompts")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="dotted config overrides, e.g. "
                             "resources.world_size=1 rollout.response_length=256")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.output is not None and Path(args.output).exists():
        print(f"hybridflow eval: --output {args.output!r} exists; nothing is overwritten, pick a new file",
              file=sys.stderr)
        return 2
    if args.max_samples is not None and args.max_samples < 1:
        print("hybridflow eval: --max-samples must be >= 1", file=sys.stderr)
        return 2
    from hybridflow.config import ConfigError
    from hybridflow.trainer.offline import evaluate_source, resolve_source, write_json_once

    try:
        source = resolve_source(args.path, args.overrides)
        report = evaluate_source(source, args.data, args.max_samples)
    except (ConfigError, FileNotFoundError, ValueError) as err:
        print(f"hybridflow eval: {err}", file=sys.stderr)
        return 2
    print_report(report)
    if args.output is not None:
        try:
            path = write_json_once(args.output, report.to_json())
        except FileExistsError:
            print(f"hybridflow eval: --output {args.output!r} appeared while scoring; not overwritten",
                  file=sys.stderr)
            return 2
        print(f"report written to {path}")
    return 0


def print_report(report) -> None:
    from rich.console import Console
    from rich.table import Table

    from hybridflow.config.dtypes import dtype_summary
    from hybridflow.config.loader import config_to_dict
    from hybridflow.trainer.display import per_source

    src, metrics = report.source, report.metrics
    what = f"checkpoint {src.checkpoint} (step {src.step})" if src.checkpoint is not None else src.model_path
    how = "sampled" if src.cfg.trainer.validation.do_sample else "greedy"
    table = Table(title=f"{what}: {how}, {', '.join(report.data)}")
    for column in ("data source", "responses", "accuracy", "score"):
        table.add_column(column, justify="left" if column == "data source" else "right")
    rows = list(per_source(metrics).items()) + [("all", {name: metrics[f"val/{name}"]
                                                         for name in ("samples", "accuracy", "score")})]
    for name, values in rows:
        table.add_row(name, str(int(values["samples"])), f"{values['accuracy']:.1%}", f"{values['score']:.4f}")
    Console().print(table)
    print(f"dtype: {dtype_summary(config_to_dict(src.cfg))}")  # the precision it was scored in
