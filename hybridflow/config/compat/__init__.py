"""Configs written for verl or TRL, read as hybridflow's own (docs/migrating.md).

    tree = translate_foreign(tree)   # a user's tree, its verl / TRL keys turned into native ones

The one hook sits where a user's tree is read (config/tasks.py `read_task_config`: the CLI's
`hybridflow train` and `RLTrainer`); a tree without such keys comes back unchanged. The
tables are verl.py and trl.py, the only modules that know those frameworks' names (engine.py
reads them). A translated config prints once, on stderr, the native keys it used and the
keys with no meaning here; the run saves the native keys in its config.yaml.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from hybridflow.config.compat.engine import Dialect, Report, translate
from hybridflow.config.compat.trl import TRL
from hybridflow.config.compat.verl import VERL, verl_metrics
from hybridflow.config.loader import nest_dotted
from hybridflow.errors import ConfigError

__all__ = ["DIALECTS", "metric_renames", "translate_foreign", "translate_tree"]

DIALECTS: tuple[Dialect, ...] = (VERL, TRL)


def translate_tree(tree: dict[str, Any]) -> tuple[dict[str, Any], list[Report]]:
    """The native tree of a user's tree (dotted keys allowed) and a report per dialect found in it."""
    from hybridflow.config.schema import RunConfig  # the tree these dialects are read into

    reports = []
    try:
        native = nest_dotted(tree)
    except ConfigError:  # native shorthand such as `env: CartPole-v1` beside `env.num_envs`: the builder reads it
        return tree, []
    for dialect in DIALECTS:
        others = tuple(top for d in DIALECTS if d is not dialect for top in d.own_tops)
        native, report = translate(dialect, native, RunConfig, others)
        if report is not None:
            reports.append(report)
    return (native, reports) if reports else (tree, [])


def translate_foreign(tree: dict[str, Any], say: Callable[[str], None] | None = None) -> dict[str, Any]:
    """`translate_tree`'s tree, its notice said (default: printed on stderr)."""
    native, reports = translate_tree(tree)
    for report in reports:
        (say or _stderr)("\n".join(report.lines()))
    return native


def _stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def metric_renames(names: list[str], samples_per_prompt: int) -> Callable[[int, dict[str, Any]], dict[str, Any]] | None:
    """What trainer.metric_names adds to each record (`fn(step, metrics) -> extra metrics`):
    other frameworks' names for the same numbers; None with hybridflow's names only."""
    if "verl" not in names:
        return None
    return lambda step, metrics: verl_metrics(step, metrics, samples_per_prompt)
