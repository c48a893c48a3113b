"""Arguments and loading shared by the commands that read the run config tree
(hybridflow/config/schema.py): `--config FILE`, `--print-config`, dotted overrides."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the schema imports torch; `hybridflow --help` must not
    from hybridflow.config.schema import RunConfig


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=None, help="YAML config file (default: the built-in defaults)")
    parser.add_argument("--print-config", action="store_true",
                        help="print the resolved config (every key, YAML) and exit without running")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="dotted overrides applied after the file, e.g. actor.optim.lr=1e-5")


def load(args: argparse.Namespace) -> RunConfig | None:
    """The run config of `args`, or None after printing a config error to stderr."""
    from hybridflow.config import ConfigError
    from hybridflow.config.loader import user_tree

    try:
        tree = user_tree(args.config, args.overrides)  # the file is read once
        from hybridflow.config.schema import run_config_from_tree
        from hybridflow.config.tasks import task_kind_of

        kind = task_kind_of(tree)
        if not kind.language_model:  # else "env: is a key of 'environment' configs"
            raise ConfigError(f"the config names {kind.marker!r}: it is a task of kind {kind.name!r}, which "
                              f"`hybridflow train` runs; `hybridflow {args.command}` takes language-model configs")
        return run_config_from_tree(tree)
    except ConfigError as err:
        print(f"hybridflow {args.command}: config error: {err}", file=sys.stderr)
        return None


def print_config(cfg: RunConfig) -> None:
    import yaml

    from hybridflow.config import config_to_dict
    from hybridflow.config.schema import resolve_run_config

    print(yaml.safe_dump(config_to_dict(resolve_run_config(cfg)), sort_keys=False), end="")
