"""Typed config trees: dataclasses filled from YAML files and dotted `key=value` overrides.

A config is a tree of dataclasses. `load_config(Root, "run.yaml", ["actor.lr=1e-5"])`
reads the YAML, applies the overrides in order, checks every key against the dataclass
fields (an unknown key names the closest valid one), converts values to the declared field
types (a choice in any case), and returns the filled instance. Dataclasses may validate themselves in
`__post_init__`; a `ConfigError` they raise, keyed relative to themselves, comes out keyed
from the root (`actor.micro_batch.epochs`), and any other ValueError names the section.
`save_config` writes the resolved tree back as YAML for the run directory.
"""

from __future__ import annotations

import collections.abc
import copy
import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

from hybridflow.errors import ConfigError
from hybridflow.registry import suggest

__all__ = ["ConfigError", "at_least", "config_to_dict", "in_unit", "load_config", "nest_dotted", "positive", "save_config",
           "user_tree", "with_overrides"]

T = TypeVar("T")


# ----------------------------------------------------------------------------- range checks
# What the sections' __post_init__ use: one ConfigError wording for every bound, keyed by the field.


def at_least(section: Any, low: float, *keys: str, null: str | None = None, note: str = "") -> None:
    """ConfigError "must be >= low[ or null (null)][ (note)], got value" for the first of
    `keys` whose value is below `low`; with `null` (what null means, may be ""), None passes."""
    _check(section, keys, lambda v: v >= low, f">= {low}", null, note)


def positive(section: Any, *keys: str, null: str | None = None) -> None:
    """ConfigError "must be > 0[ or null], got value" for the first of `keys` that is not > 0."""
    _check(section, keys, lambda v: v > 0, "> 0", null, "")


def in_unit(section: Any, *keys: str) -> None:
    """ConfigError "must be in [0, 1], got value" for the first of `keys` outside [0, 1]."""
    _check(section, keys, lambda v: 0.0 <= v <= 1.0, "in [0, 1]", None, "")


def _check(section: Any, keys: tuple[str, ...], ok: Any, bound: str, null: str | None, note: str) -> None:
    for key in keys:
        value = getattr(section, key)
        if (value is None and null is not None) or ok(value):
            continue
        nullable = "" if null is None else " or null" + (f" ({null})" if null else "")
        raise ConfigError(f"must be {bound}{nullable}{f' ({note})' if note else ''}, got {value}", key)


def _parse_override(text: str) -> tuple[list[str], Any]:
    if "=" not in text:
        raise ConfigError(f"override {text!r} is not of the form key.path=value")
    key, raw = text.split("=", 1)
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {text!r} has an empty key part")
    # YAML parsing gives ints, floats, bools, null and lists the way a user types them.
    try:
        return key.split("."), yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError as err:
        raise ConfigError(f"override {text!r}: the value is not valid YAML ({_yaml_problem(err)}); quote it "
                          f"(e.g. {key}='\"...\"') or fix the brackets") from None


def _yaml_problem(err: yaml.YAMLError) -> str:
    """`problem at line L, column C` of a YAML error, without PyYAML's multi-line snippet."""
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else problem


def _set_path(tree: dict, path: list[str], value: Any) -> None:
    node = tree
    for part in path[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"cannot set {'.'.join(path)}: {part!r} is a value, not a section")
        node = child
    node[path[-1]] = value


def _convert(value: Any, annotation: Any, where: str, base: Any = None) -> Any:
    """`value` as `annotation`; `base` is the field's default, which a partial section fills in."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if annotation is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        alternatives = [a for a in args if a is not type(None)]
        if len(alternatives) == 1 and dataclasses.is_dataclass(alternatives[0]):  # an optional section
            return _convert(value, alternatives[0], where, base)
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _convert(value, arg, where, base)
            except ConfigError as err:
                errors.append(err.message)
        null = " (or null)" if type(None) in args else ""
        raise ConfigError(f"{' or '.join(errors)}{null}", where)  # each alternative's own words, no typing repr
    if origin is typing.Literal:
        if isinstance(value, str) and value not in args and value.lower() in args:
            return value.lower()  # choices are case-insensitive ("Spread" is "spread")
        if value not in args:
            raise ConfigError(f"{value!r} is not one of {list(args)}", where)
        return value
    if dataclasses.is_dataclass(annotation):
        if not isinstance(value, dict):
            raise ConfigError(f"expected a section (mapping), got {value!r}", where)
        return _build(annotation, value, where, base if isinstance(base, annotation) else None)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"expected a list, got {value!r}", where)
        item_type = args[0] if args else Any
        items = [_convert(v, item_type, f"{where}[{i}]") for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if origin is collections.abc.Callable:
        if not callable(value):
            raise ConfigError(f"expected a function, got {value!r}", where)
        return value
    if dict in (origin, annotation):  # dict[str, Any] or a bare dict
        if not isinstance(value, dict):
            raise ConfigError(f"expected a mapping, got {value!r}", where)
        return dict(value)
    if annotation is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"expected true/false, got {value!r}", where)
        return value
    if annotation in (int, float) and isinstance(value, (int, float, str)) and not isinstance(value, bool):
        try:
            number = float(value)  # YAML reads "1e-5" and "1e5" (no dot) as strings
        except ValueError:
            number = None
        if annotation is float and number is not None:
            return number
        if not isinstance(value, int) and number is not None and number.is_integer():
            return int(number)  # a whole number of steps written 1e5, as train(steps=1e5) takes it
    if annotation in (int, str, float) and not isinstance(value, annotation) or (
        annotation is int and isinstance(value, bool)
    ):
        raise ConfigError(f"expected {annotation.__name__}, got {value!r}", where)
    return value


def _build(cls: type[T], values: dict, prefix: str = "", base: Any = None) -> T:
    """Instantiate `cls` from `values`; keys not given come from `base` (a fresh default
    instance of cls, not used elsewhere) when there is one, else from the class's own defaults."""
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for key, value in values.items():
        where = f"{prefix}.{key}" if prefix else key
        if key not in fields:
            close = suggest(key, list(fields))
            hint = f"did you mean {close[0]!r}?" if close else f"valid keys: {sorted(fields)}"
            raise ConfigError(f"unknown config key; {hint}", where)
        factory = fields[key].default_factory  # a fresh default for a partial section to fill in
        default = getattr(base, key) if base is not None else (
            fields[key].default if factory is dataclasses.MISSING else factory())
        kwargs[key] = _convert(value, hints[key], where, default)
    try:
        return cls(**kwargs) if base is None else dataclasses.replace(base, **kwargs)
    except ConfigError as err:
        raise err.within(prefix) from err  # its key is relative to cls, which sits at `prefix`
    except (TypeError, ValueError) as err:
        raise ConfigError(f"invalid section ({cls.__name__}): {err}", prefix or None) from err


def load_config(cls: type[T], path: str | Path | None = None, overrides: list[str] = ()) -> T:
    """Build `cls` from an optional YAML file plus dotted overrides (applied in order)."""
    return _build(cls, user_tree(path, overrides))


def user_tree(path: str | Path | None = None, overrides: list[str] = ()) -> dict[str, Any]:
    """The keys the user set: the YAML file's tree with the dotted overrides applied in order."""
    tree: dict = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {str(path)!r} does not exist")
        try:
            loaded = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as err:
            raise ConfigError(f"config file {str(path)!r} is not valid YAML: {_yaml_problem(err)}; fix that line "
                              "(check indentation, colons and quotes)") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {str(path)!r} must hold a mapping at the top level")
        tree = loaded
    return with_overrides(tree, overrides)


def with_overrides(tree: dict[str, Any], overrides: list[str] = ()) -> dict[str, Any]:
    """A copy of `tree` with the dotted overrides applied in order (`tree` is not changed,
    so a tree read once can serve twice: a resumed run's saved config and the new one)."""
    tree = copy.deepcopy(tree)
    for text in overrides:
        key_path, value = _parse_override(text)
        _set_path(tree, key_path, value)
    return tree


def nest_dotted(tree: dict[str, Any]) -> dict[str, Any]:
    """A user's tree with dotted keys ("ppo.lr": 1e-3) as nested sections, merged with the
    sections given as such ({"ppo": {"epochs": 3}}); the input is not changed."""
    nested: dict[str, Any] = {}
    for key, value in tree.items():
        if not isinstance(key, str):
            raise ConfigError(f"config keys are strings, got {key!r}")
        _merge(nested, key.split("."), value)
    return nested


def _merge(tree: dict[str, Any], path: list[str], value: Any) -> None:
    """Set `path` to a copy of `value`; a section merges into what dotted keys already set there."""
    if not isinstance(value, dict):
        _set_path(tree, path, value)
        return
    node: Any = tree
    for part in path:
        node = node.get(part) if isinstance(node, dict) else None
    if not isinstance(node, dict):
        _set_path(tree, path, {})
    for key, inner in value.items():
        _merge(tree, [*path, key], inner)


def config_to_dict(config: Any) -> dict:
    """A plain dict of the resolved config (tuples as lists, keys in declaration order), fit for
    YAML or JSON; without the dotted keys its `omitted_keys()` names (those of other task kinds)."""
    tree = dataclasses.asdict(config)
    for key in getattr(config, "omitted_keys", tuple)():
        *parents, last = key.split(".")
        node = tree
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(last, None)
    return yaml.safe_load(yaml.safe_dump(to_plain(tree), sort_keys=False))


def to_plain(value: Any) -> Any:
    """`value` as Python values fit for YAML or JSON: lists for tuples, numpy scalars and
    arrays through their `tolist`, inside dicts and lists."""
    if isinstance(value, dict):
        return {k: to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    return to_plain(value.tolist()) if hasattr(value, "tolist") else value


def save_config(config: Any, path: str | Path) -> Path:
    """Write the resolved config as YAML (atomically: a crash never leaves half a file)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(yaml.safe_dump(config_to_dict(config), sort_keys=False))
    tmp.replace(path)
    return path
