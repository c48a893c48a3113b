"""The `hybridflow` command."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Callable

from hybridflow.cli import eval as eval_cmd
from hybridflow.cli import export, monitor, plan, plot, preprocess, rm, selfcheck, train
from hybridflow.errors import UserInputError


DEBUG_HELP = "show the full Python traceback of an error (default: one or two lines naming the problem)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hybridflow", description=__doc__.splitlines()[0])
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    sub = parser.add_subparsers(dest="command", required=True)

    for add in (train.add_parsers, selfcheck.add_parser, preprocess.add_parser, rm.add_parser,
                eval_cmd.add_parser, export.add_parser, plot.add_parser, plan.add_parser, monitor.add_parser):
        add(sub)
    for command in sub.choices.values():
        # SUPPRESS: an absent subcommand flag must not reset `hybridflow --debug train`.
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line parsed; dotted overrides may come before or after the options."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # argparse stops filling the positional `overrides` at the first option, so
    # `eval PATH --data F key=value` would leave key=value over.
    if extra and hasattr(args, "overrides") and all("=" in e and not e.startswith("-") for e in extra):
        args.overrides = list(args.overrides) + extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: list[str] | None = None) -> int:
    # Per-file "Loading weights" / "Writing model shards" bars from every rank drown the
    # run's own progress display; set before transformers is imported here or in the
    # Ray workers (which inherit this environment). An explicit user setting wins.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    args = parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    if args.debug:
        return handler(args)
    try:
        try:
            with no_input():
                return handler(args)
        except BaseException as err:  # after a SIGTERM / SIGINT, whatever ended the command is the stop
            stopped = stopped_by_signal(err)
            if stopped is None:
                raise
            print(f"hybridflow {args.command}: {stopped}", file=sys.stderr)
            return sys.modules["hybridflow.trainer.run.stop_signal"].STOP.exit_status  # as if the signal had ended it
    except UserInputError as err:
        print(f"hybridflow {args.command}: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"hybridflow {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # noqa: BLE001 - the one place every other failure is reported
        text = worker_failure(err) or f"error: {one_line(err)}"
        print(f"hybridflow {args.command}: {text}\n(run again with --debug for the traceback)", file=sys.stderr)
        return 1


@contextmanager
def no_input() -> Iterator[None]:
    """sys.stdin at end of file while a command runs: no library can ask a question and
    act on the answer (transformers' "run the custom code? [y/N]" did, from piped input)."""
    saved = sys.stdin
    with open(os.devnull, encoding="utf-8") as devnull:
        sys.stdin = devnull
        try:
            yield
        finally:
            sys.stdin = saved


def stopped_by_signal(err: BaseException) -> str | None:
    """The line to print when the command ended because of a SIGTERM or SIGINT
    (trainer/run/stop_signal.py), None otherwise: the trainer's own report, or that the step in
    progress was abandoned."""
    stop = sys.modules.get("hybridflow.trainer.run.stop_signal")  # loaded wherever a run handles the signals
    if stop is None or not stop.STOP.received:
        return None
    if isinstance(err, stop.RunTerminated):
        return err.reported()
    if not isinstance(err, Exception):  # KeyboardInterrupt, SystemExit: reported as such
        return None
    return f"stopped by {stop.STOP.name} (the step in progress was abandoned: {one_line(err)})"


def worker_failure(err: BaseException) -> str | None:
    """The report of a worker failure (controller/errors.py `WorkerError`), None for other
    errors: its first paragraph (role, rank, node, pid, the call, what happened, what to
    do; a worker's exception without its traceback) and hybridflow's notes on it (the step
    and phase, why the run was not restarted, the run directory)."""
    errors = sys.modules.get("hybridflow.controller.errors")  # loaded wherever a WorkerError exists
    if errors is None or not isinstance(err, errors.WorkerError):
        return None
    notes = [note.removeprefix("hybridflow: ") for note in getattr(err, "__notes__", ())
             if note.startswith("hybridflow: ")]
    return "\n".join([str(err).split("\n")[0], *notes])


def one_line(err: BaseException) -> str:
    """`Type: message` of `err`, at most a few hundred characters of its first lines."""
    text = " ".join(str(err).split("\n")[:3]).strip()
    text = text if len(text) <= 600 else text[:600] + " ..."
    return f"{type(err).__name__}: {text}" if text else type(err).__name__

