"""OmegaConf-style `${...}` references in a YAML tree, resolved to values (verl's configs use them).

    resolve_references({"a": 1, "b": "${a}", "c": {"d": "${.e}", "e": 2}})   # b -> 1, c.d -> 2

Forms: `${x.y}` (from the root), `${.y}` (beside the key), `${oc.select:x.y,default}` (the
default when x.y is missing or null), `${oc.env:VAR,default}`; a string holding references
among other text gets their values as text. A reference nobody can resolve is a ConfigError.
"""

from __future__ import annotations

import copy
import os
import re
from typing import Any

import yaml

from hybridflow.errors import ConfigError

_REF = re.compile(r"\$\{([^${}]*)\}")
_UNSET = object()


def resolve_references(tree: dict[str, Any]) -> dict[str, Any]:
    """A copy of `tree` with every `${...}` replaced by its value."""
    root = copy.deepcopy(tree)
    return _resolved(root, root, [], 0)


def _resolved(root: dict[str, Any], node: Any, path: list[str], depth: int) -> Any:
    """`node` (at `path`) with its references resolved, inside mappings and lists too."""
    if isinstance(node, dict):
        return {k: _resolved(root, v, [*path, str(k)], depth) for k, v in node.items()}
    if isinstance(node, list):
        return [_resolved(root, v, path, depth) for v in node]
    return _value(root, node, path, depth) if isinstance(node, str) else node


def _value(root: dict[str, Any], text: str, path: list[str], depth: int) -> Any:
    if depth > 20:
        raise ConfigError(f"references {text!r} in a cycle", ".".join(path))
    whole = _REF.fullmatch(text.strip())
    if whole:
        found, at = _lookup(root, whole.group(1), path, depth)
        return _resolved(root, found, at, depth + 1)
    if "${" not in text:
        return text
    return _REF.sub(lambda m: str(_value(root, "${" + m.group(1) + "}", path, depth + 1)), text)


def _lookup(root: dict[str, Any], expression: str, path: list[str], depth: int) -> tuple[Any, list[str]]:
    """The value an expression refers to, and the key it sits at (its own references are
    relative to that key)."""
    where = ".".join(path)
    if expression.startswith("oc.env:"):
        name, _, default = expression[len("oc.env:"):].partition(",")
        return os.environ.get(name.strip(), _literal(default) if default else None), path
    if expression.startswith("oc.select:"):
        key, _, default = expression[len("oc.select:"):].partition(",")
        found, at = _get(root, key.strip(), path)
        return (_literal(default), path) if found is _UNSET or found is None else (found, at)
    if ":" in expression:
        raise ConfigError(f"{'${' + expression + '}'}: only ${{key}}, ${{oc.select:key,default}} and "
                          "${oc.env:VAR,default} references are read; write the value itself", where)
    found, at = _get(root, expression.strip(), path)
    if found is _UNSET:
        raise ConfigError(f"refers to {expression!r}, which the config does not have; write the value itself", where)
    return found, at


def _get(root: dict[str, Any], key: str, path: list[str]) -> tuple[Any, list[str]]:
    """The value at `key` (from the root, or with a leading dot beside `path`'s key) and its path."""
    if key.startswith("."):
        dots = len(key) - len(key.lstrip("."))
        parts = path[:-dots] + key[dots:].split(".")
    else:
        parts = key.split(".")
    node: Any = root
    for part in parts:
        if not isinstance(node, dict) or part not in node:
            return _UNSET, parts
        node = node[part]
    return node, parts


def _literal(text: str) -> Any:
    """A default as OmegaConf reads it: YAML (null, false, 3, [], "quoted")."""
    return yaml.safe_load(text.strip()) if text.strip() else ""
