"""The translation of another framework's config keys into the native tree, from a table of rows.

A `Dialect` (verl.py, trl.py) is a table of `Row`s, one per foreign dotted key (or fnmatch
pattern): `convert(value, ctx)` gives the native keys and values it stands for (`Out`, with
a note on units), or the row has no meaning here (`convert` None: listed in the run's notice),
or only its no-op values are accepted (`accepts`). `translate` reads a user's tree once:
native leaves pass through; foreign ones are converted; two keys setting one native key to
different values are refused by name (a row's `priority` settles verl's own fall-backs, e.g.
rollout.response_length over data.max_response_length); a native key set both ways is refused.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from hybridflow.errors import ConfigError
from hybridflow.registry import suggest

Out = dict[str, Any]  # native dotted key -> value


@dataclass(frozen=True)
class Row:
    """One foreign key. key: dotted, or an fnmatch pattern ("x.profiler.*"). to: the native
    keys it may set (docs and suggestions). convert: value -> Out (None: no meaning here).
    why: why a key has no meaning here, or the note on a conversion's units. accepts: for rows
    without meaning, the values that change nothing (others are refused with `why`); None: any.
    priority: the higher wins when two keys set one native key."""

    key: str
    to: tuple[str, ...] = ()
    convert: Callable[[Any, Ctx], Out] | None = None
    why: str = ""
    accepts: Callable[[Any], bool] | None = None
    priority: int = 0
    plain: bool = False  # the native key of the same name and meaning (data.train_files)
    fixed: bool = False  # `accepts` are the values of what hybridflow always does (fsdp, AdamW)


def same(key: str, native: str, priority: int = 0, why: str = "") -> Row:
    """The key is the native one under another name (null: left unset)."""
    return Row(key, (native,), lambda v, ctx: {} if v is None else {native: v}, why, priority=priority,
               plain=native == key)


def conv(key: str, to: str | tuple[str, ...], fn: Callable[[Any, Ctx], Out], why: str = "", priority: int = 0) -> Row:
    return Row(key, (to,) if isinstance(to, str) else to, fn, why, priority=priority)


def unused(key: str, why: str) -> Row:
    """No meaning here, whatever the value (a performance knob of another engine...)."""
    return Row(key, (), None, why)


def only(key: str, values: tuple[Any, ...], feature: str) -> Row:
    """A switch of a `feature` hybridflow does not have: its values that leave it off are
    accepted (no meaning here), any other is refused."""
    return Row(key, (), None, feature, accepts=lambda v: v in values)


def fixed(key: str, values: tuple[Any, ...], what: str) -> Row:
    """A choice hybridflow always makes the one way (`what`): those values are accepted, others refused."""
    return Row(key, (), None, what, accepts=lambda v: v in values, fixed=True)


@dataclass
class Ctx:
    """What a conversion may read: the dialect's keys as given and the native keys of the tree."""

    given: dict[str, Any]
    native: dict[str, Any]
    pinned: dict[str, tuple[Any, str]] = field(default_factory=dict)  # native key -> (value, why)

    def get(self, key: str, default: Any = None) -> Any:
        value = self.given.get(key)
        return default if value is None else value

    def first(self, *keys: str, default: Any = None) -> Any:
        """The value of the first of `keys` given: a dialect key, or a native one written "native:key"."""
        for key in keys:
            value = self.native.get(key[7:]) if key.startswith("native:") else self.given.get(key)
            if value is not None:
                return value
        return default

    def pin(self, native: str, value: Any, why: str) -> Any:
        """Set `native` (lowest priority) because a conversion counted on this value of it."""
        if native not in self.native:
            self.pinned[native] = (value, why)
        return self.native.get(native, value)


@dataclass(frozen=True)
class Dialect:
    """A framework's keys. name: in messages ("verl"). rows: the table. own_tops: top-level
    sections only it has (a key there that no row knows is its typo, suggested among its rows).
    resolve: rewrites its tree before reading (verl: interpolations). extra: cross-key checks
    on the given keys -> Out added. detects: whether a tree is written in it (None: any key of
    a row that is no native key)."""

    name: str
    rows: tuple[Row, ...]
    own_tops: tuple[str, ...]
    resolve: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    extra: Callable[[Ctx], Out] | None = None
    detects: Callable[[dict[str, Any]], bool] | None = None

    def exact(self) -> dict[str, Row]:
        return {r.key: r for r in self.rows if not _is_pattern(r.key)}

    def row_of(self, key: str) -> Row | None:
        row = self.exact().get(key)
        if row is not None:
            return row
        return next((r for r in self.rows if _is_pattern(r.key) and _matches(key, r.key)), None)


@dataclass
class Report:
    """What a translation did, for the one notice at start and the tests."""

    dialect: str
    mapped: list[tuple[str, Any, Out, str]] = field(default_factory=list)  # key, value, out, note
    unused: list[tuple[str, Any, str]] = field(default_factory=list)  # key, value, why
    pinned: list[tuple[str, Any, str]] = field(default_factory=list)  # native key, value, why

    def native(self) -> Out:
        """Every native key this translation set, with its value (the winners)."""
        out: Out = {}
        for _, _, emitted, _ in self.mapped:
            out.update(emitted)
        out.update({k: v for k, v, _ in self.pinned})
        return out

    def lines(self) -> list[str]:
        """The notice: the native keys used, then the keys with no meaning here grouped by reason."""
        lines = [f"{self.dialect} config: {len(self.mapped)} keys translated to hybridflow's (saved in the run's "
                 "config.yaml as these):"]
        for key, value, out, note in self.mapped:
            target = ", ".join(f"{k}={_show(v)}" for k, v in out.items()) or "(the value hybridflow has already)"
            lines.append(f"  {key}={_show(value)} -> {target}" + (f" ({note})" if note else ""))
        for native, value, why in self.pinned:
            lines.append(f"  (not given) -> {native}={_show(value)} ({why})")
        if self.unused:
            lines.append(f"{self.dialect} keys with no meaning here, not used ({len(self.unused)}):")
            by_reason: dict[str, list[str]] = {}
            for key, value, why in self.unused:
                by_reason.setdefault(why, []).append(f"{key}={_show(value)}")
            lines.extend(f"  {', '.join(keys)}: {why}" for why, keys in by_reason.items())
        return lines


def _show(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def _is_pattern(key: str) -> bool:
    return any(c in key for c in "*?[")


def _matches(key: str, pattern: str) -> bool:
    # "a.b.*" covers a.b itself too (a section given as an empty mapping, e.g. override_config: {})
    return fnmatch.fnmatchcase(key, pattern) or (pattern.endswith(".*") and key == pattern[:-2])


# ----------------------------------------------------------------------------- the tree


MISSING_MARK = "???"  # OmegaConf's "a value you must give": the key is not given
STRUCTURAL = "_target_"  # Hydra's class to build: not a setting


def leaves(tree: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every leaf; an empty mapping is a leaf ({}), Hydra's _target_
    entries and OmegaConf's ??? are skipped (neither is a setting)."""
    for key, value in tree.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if key == STRUCTURAL or value == MISSING_MARK:
            continue
        if isinstance(value, dict) and value:
            yield from leaves(value, dotted)
        else:
            yield dotted, value


def native_paths(root: type) -> tuple[set[str], set[str]]:
    """(leaf keys, free sections) of a native config class: the dotted keys of its fields,
    and the keys of fields that hold free mappings (a dict: any key below is theirs)."""
    keys: set[str] = set()
    free: set[str] = set()

    def walk(cls: type, prefix: str) -> None:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if not f.init:
                continue
            dotted = f"{prefix}{f.name}"
            kind = hints[f.name]
            inner = [a for a in typing.get_args(kind) if a is not type(None)] or [kind]
            section = next((a for a in inner if dataclasses.is_dataclass(a)), None)
            if section is not None:
                keys.add(dotted)  # a section given a value (e.g. null) is still its key
                walk(section, dotted + ".")
            else:
                keys.add(dotted)
                if dict in inner or typing.get_origin(inner[0]) is dict:
                    free.add(dotted)

    walk(root, "")
    return keys, free


def is_native(key: str, keys: set[str], free: set[str]) -> bool:
    return key in keys or any(key.startswith(f + ".") for f in free)


# ----------------------------------------------------------------------------- translation


def translate(dialect: Dialect, tree: dict[str, Any], root: type,
              others: tuple[str, ...] = ()) -> tuple[dict[str, Any], Report | None]:
    """The native tree of `tree` (a nested mapping) and the report; (tree, None) unchanged when
    no key of the dialect is in it. Keys under the top-level sections `others` (another
    dialect's) are left as they are."""
    keys, free = native_paths(root)
    detected = dialect.detects(tree) if dialect.detects is not None else any(
        k.split(".")[0] in dialect.own_tops or dialect.row_of(k) is not None and not is_native(k, keys, free)
        for k, _ in leaves(tree))
    if not detected:
        return tree, None
    if dialect.resolve is not None:
        tree = dialect.resolve(tree)
    given: dict[str, Any] = {}
    native: dict[str, Any] = {}
    report = Report(dialect.name)
    for key, value in leaves(tree):
        row = dialect.row_of(key)
        if row is not None and not (row.plain and is_native(key, keys, free)):
            given[key] = value
        elif is_native(key, keys, free) or key.split(".")[0] in others:
            native[key] = value
            if row is not None:  # a key both have, with one meaning: said like the others
                report.mapped.append((key, value, {key: value}, row.why))
        else:
            raise _unknown(dialect, key, keys)
    ctx = Ctx(given, native)
    claims: dict[str, list[tuple[Any, str, int]]] = {}  # native key -> (value, source, priority)
    for key, value in given.items():
        row = dialect.row_of(key)
        if row.convert is None:
            if row.accepts is not None and not row.accepts(value):
                wanted = f"hybridflow has only {row.why}" if row.fixed else f"it asks for {row.why}, which " \
                                                                           "hybridflow does not have"
                raise ConfigError(f"{_show(value)}: {wanted}; remove the key", key)
            why = row.why if row.accepts is None else f"as hybridflow always has it: {row.why}" if row.fixed else \
                f"leaves off {row.why}, which hybridflow does not have"
            report.unused.append((key, value, why))
            continue
        out = row.convert(value, ctx)
        if not out:
            report.unused.append((key, value, row.why or "null: left at hybridflow's default"))
            continue
        for native_key, native_value in out.items():
            claims.setdefault(native_key, []).append((native_value, key, row.priority))
        report.mapped.append((key, value, out, row.why))
    if dialect.extra is not None:
        for native_key, native_value in dialect.extra(ctx).items():
            claims.setdefault(native_key, []).append((native_value, "(these keys together)", 100))
    winners = _settle(claims, native)
    report.mapped = [(k, v, {nk: nv for nk, nv in out.items() if winners.get(nk, (None, k))[1] == k}
                      or _superseded(out, winners), note) for k, v, out, note in report.mapped]
    for native_key, (value, why) in ctx.pinned.items():
        if native_key not in winners:
            winners[native_key] = (value, "(pinned)")
            report.pinned.append((native_key, value, why))
    result: dict[str, Any] = {}
    for key, value in native.items():
        _put(result, key, value)
    for key, (value, _) in winners.items():
        _put(result, key, value)
    return result, report


def _superseded(out: Out, winners: dict[str, tuple[Any, str]]) -> Out:
    """A key whose native keys another key set: shown as what won, e.g. rollout.response_length."""
    return {f"{k} (from {winners[k][1]})": winners[k][0] for k in out}


def _settle(claims: dict[str, list[tuple[Any, str, int]]], native: dict[str, Any]) -> dict[str, tuple[Any, str]]:
    winners: dict[str, tuple[Any, str]] = {}
    for native_key, options in claims.items():
        top = max(p for _, _, p in options)
        best = [(v, source) for v, source, p in options if p == top]
        clashing = [(v, s) for v, s in best if not _same(v, best[0][0])]
        if clashing:
            (v1, s1), (v2, s2) = best[0], clashing[0]
            raise ConfigError(f"{s1}={_show(v1)} and {s2}={_show(v2)} both set {native_key}, to different values: "
                              "keep one of them", s2)
        value, source = best[0]
        if native_key in native and not _same(native[native_key], value):
            raise ConfigError(f"{source} sets {native_key}={_show(value)}, and the config also sets {native_key}="
                              f"{_show(native[native_key])} itself: keep one of the two", native_key)
        winners[native_key] = (value, source)
    return winners


def _same(a: Any, b: Any) -> bool:
    """Equal values, a number written as YAML reads "1e-6" (a string) counting as that number."""
    return a == b or _number(a) is not None and _number(a) == _number(b)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        return float(value)
    except ValueError:
        return None


def _put(tree: dict[str, Any], key: str, value: Any) -> None:
    node = tree
    parts = key.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value


def _unknown(dialect: Dialect, key: str, native_keys: set[str]) -> ConfigError:
    """An unknown key: suggested among the dialect's keys of its section (a section only the
    dialect has), or among both the dialect's and the native keys of a shared section."""
    top = key.split(".")[0]
    options = [r.key for r in dialect.rows if not _is_pattern(r.key) and r.key.split(".")[0] == top]
    if top not in dialect.own_tops:
        options += [k for k in native_keys if k.split(".")[0] == top]
    parent = key.rsplit(".", 1)[0]
    siblings = [o for o in options if o.rsplit(".", 1)[0] == parent]
    close = suggest(key, siblings) or suggest(key, options)
    where = f"a {dialect.name} key" if top in dialect.own_tops else f"a {dialect.name} or hybridflow key"
    hint = f"did you mean {' or '.join(close)}?" if close else "docs/migrating.md lists the keys that translate"
    return ConfigError(f"unknown config key: not {where}; {hint}", key)
