"""Arguments and loading shared by the commands that read the run config tree
(hybridflow/config/schema.py): `--config FILE`, `--print-config`, dotted overrides."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the schema imports torch; `hybridflow --help` must not
    from hybridflow.config.schema import RunConfig


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=None, help="YAML config file (default: the built-in defaults)")
    parser.add_argument("--print-config", action="store_true",
                        help="print the resolved config (every key, YAML) and exit without running")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="dotted overrides applied after the file, e.g. actor.optim.lr=1e-5")


def add_resume_argument(parser: argparse.ArgumentParser, may_change: str) -> None:
    """`--resume [PATH]`: continue a run from a checkpoint (`resume_tree`); `may_change`: the
    keys the overrides may change."""
    parser.add_argument(
        "--resume", nargs="?", const=True, default=None, metavar="PATH",
        help="continue a run from a checkpoint, in its run directory: PATH is a run directory (its newest "
             "complete checkpoint) or a checkpoints/global_step_<N> directory; without PATH, the newest "
             "checkpoint among the runs of this config's name under trainer.output_dir. The config is the "
             f"run's saved config.yaml (or --config FILE) plus the key=value overrides, which may change {may_change}")


def resume_tree(args: argparse.Namespace, runs_config: Callable[[dict[str, Any]], Any]) -> tuple[Any, dict[str, Any]]:
    """(what to resume: None, True, a checkpoint path or a SavedRun; the user's config tree)
    of `--resume`, `--config` and the overrides. Without --config the tree is the resumed run's
    config.yaml (read once: the trainer checks the difference against the same tree) with the
    overrides; `--resume` without PATH nor --config finds the runs by `runs_config(overrides)`'s
    name and trainer.output_dir. Raises ConfigError (or CheckpointNotFoundError)."""
    from hybridflow.config.loader import user_tree, with_overrides

    resume, overrides = getattr(args, "resume", None), list(args.overrides)
    if isinstance(resume, str) and "=" in resume and not Path(resume).exists():
        # `--resume key=value`: argparse gave the first override to the optional PATH.
        resume, overrides = True, [resume, *overrides]
    if resume is True and args.config is None:  # the newest run of the overrides' name, with its saved config
        from hybridflow.trainer.run.lifecycle import checkpoint_of_runs

        resume = checkpoint_of_runs(runs_config(user_tree(None, overrides)))
    if args.config is None and isinstance(resume, (str, Path)):
        from hybridflow.trainer.run.checkpointing import saved_run

        resume = saved_run(resume)
        return resume, with_overrides(resume.tree, overrides)
    return resume, user_tree(args.config, overrides)  # the file is read once


def load(args: argparse.Namespace) -> tuple[Any, RunConfig] | None:
    """(what to resume, as `resume_tree`; the language-model run config of `args`), or None
    after printing a config error to stderr."""
    from hybridflow.config import ConfigError
    from hybridflow.config.schema import run_config_from_tree

    try:
        resume, tree = resume_tree(args, run_config_from_tree)
        from hybridflow.config.tasks import task_kind_of

        kind = task_kind_of(tree)
        if not kind.language_model:  # else "env: is a key of 'environment' configs"
            raise ConfigError(f"the config names {kind.marker!r}: it is a task of kind {kind.name!r}, which "
                              f"`hybridflow {kind.command}` runs; `hybridflow {args.command}` takes language-model "
                              "configs")
        return resume, run_config_from_tree(tree)
    except ConfigError as err:
        print(f"hybridflow {args.command}: config error: {err}", file=sys.stderr)
        return None


def print_config(cfg: RunConfig) -> None:
    import yaml

    from hybridflow.config import config_to_dict
    from hybridflow.config.schema import resolve_run_config

    print(yaml.safe_dump(config_to_dict(resolve_run_config(cfg)), sort_keys=False), end="")
