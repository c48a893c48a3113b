"""Task kinds: what kind of run a config describes, decided once, from a declared row.

    kind = task_kind_of(tree)            # the "environment" row when the tree names an `env`
    check_top_level_keys(tree)           # a misspelt top-level key: ConfigError with did-you-mean
    cfg = kind.build(tree)               # its typed, validated config (RunConfig, EnvRunConfig)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from hybridflow.errors import ConfigError
from hybridflow.registry import Registry, import_object, suggest


@dataclass(frozen=True)
class TaskKind:
    """name: the kind ("language_model", "environment"). marker: the top-level key only its
    tree has (None: the kind of a tree that has no other kind's marker). root, build_path,
    resolve_path: "module:attr" paths of the config class, of `build(tree) ->
    config` and of `resolve(config) -> config as a run saves it` (the trainer runs every kind
    with its part: trainer/task.py). checkpoint_kind: trainer_state.json's "kind" of its
    checkpoints (None: checkpoints without one)."""

    name: str
    marker: str | None
    root: str
    build_path: str
    resolve_path: str
    checkpoint_kind: str | None = None

    def root_class(self) -> type:
        return import_object(self.root, None, "config tree")

    def build(self, tree: dict[str, Any]) -> Any:
        """The typed, validated config of a user's tree (its dotted keys allowed)."""
        return import_object(self.build_path, None, "config builder")(tree)

    def resolve(self, config: Any) -> Any:
        """The config as a run saves it (the values that null stands for filled in)."""
        return import_object(self.resolve_path, None, "config resolver")(config)


TASK_KINDS: Registry[TaskKind] = Registry("task kind", rows=True, identity=lambda kind: kind.build_path)
TASK_KINDS.add("language_model", TaskKind(
    "language_model", None, "hybridflow.config.schema:RunConfig", "hybridflow.config.schema:run_config_from_tree",
    "hybridflow.config.schema:resolve_run_config"))
TASK_KINDS.add("environment", TaskKind(
    "environment", "env", "hybridflow.config.env_schema:EnvRunConfig",
    "hybridflow.config.env_schema:env_config_from_dict", "hybridflow.config.env_schema:resolve_env_config",
    checkpoint_kind="env"))


def task_kind_of(tree: dict[str, Any]) -> TaskKind:
    """The kind whose marker is a top-level key of `tree` (dotted keys count by their first
    part), else the kind without a marker."""
    top = {key.split(".")[0] for key in tree if isinstance(key, str)}
    marked = [kind for kind in TASK_KINDS.entries.values() if kind.marker is not None and kind.marker in top]
    if len(marked) > 1:
        raise ConfigError(f"the config names {', '.join(k.marker for k in marked)}: keys of different task kinds "
                          f"({', '.join(k.name for k in marked)}); keep those of one")
    if marked:
        return marked[0]
    return next(kind for kind in TASK_KINDS.entries.values() if kind.marker is None)


def task_kind_of_config(config: Any) -> TaskKind | None:
    """The kind whose config class `config` is an instance of (None: not a typed config)."""
    return next((kind for kind in TASK_KINDS.entries.values() if isinstance(config, kind.root_class())), None)


def task_kind_of_checkpoint(state: dict[str, Any]) -> TaskKind:
    """The kind that wrote a checkpoint, from its trainer_state.json."""
    recorded = state.get("kind")
    return next(kind for kind in TASK_KINDS.entries.values() if kind.checkpoint_kind == recorded)


def check_top_level_keys(tree: dict[str, Any]) -> None:
    """A ConfigError for a top-level key that no task kind knows, naming the closest known
    one ("enviroment: unknown key; did you mean env?"), before any kind is decided: a
    misspelt marker would otherwise make a run of the wrong kind."""
    if not isinstance(tree, dict):
        raise ConfigError(f"a config is a mapping of keys to values, got {type(tree).__name__}")
    known = sorted({key for kind in TASK_KINDS.entries.values() for key in _top_keys(kind)})
    for key in tree:
        if not isinstance(key, str):
            raise ConfigError(f"config keys are strings, got {key!r}")
        top = key.split(".")[0]
        if top not in known:
            close = suggest(top, known)
            hint = f"did you mean {' or '.join(close)}?" if close else f"known keys: {', '.join(known)}"
            raise ConfigError(f"unknown key; {hint}", top)


def read_task_config(tree: dict[str, Any]) -> tuple[TaskKind, Any]:
    """Check the top-level keys, decide the kind (once) and build its config."""
    check_top_level_keys(tree)
    kind = task_kind_of(tree)
    if kind.marker is None:  # the kind of a config without another kind's marker: was the marker forgotten?
        for key in tree:
            check_own_key(kind, key.split(".")[0])
    try:
        return kind, kind.build(tree)
    except ConfigError as err:
        if err.message.startswith("unknown config key"):
            check_own_key(kind, (err.key or "").split(".")[0])
        raise


def check_own_key(kind: TaskKind, top: str) -> None:
    """A ConfigError when the top-level key `top` is another kind's only (else "sac: unknown
    config key; did you mean 'actor'?" for an environment task's key in a config without env)."""
    other = next((k for k in TASK_KINDS.entries.values() if top in _top_keys(k) - _top_keys(kind)), None)
    if other is not None:
        why = f"it names {kind.marker!r}" if kind.marker else f"it names no {other.marker!r}"
        fix = f"set {other.marker} or drop {top}" if other.marker else f"drop {top}"
        raise ConfigError(f"is a key of {other.name!r} configs, and this config is of kind {kind.name!r} ({why}): "
                          f"{fix}", top)


def _top_keys(kind: TaskKind) -> set[str]:
    return {f.name for f in dataclasses.fields(kind.root_class())}
