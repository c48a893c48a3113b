"""Named registries for every extension point, one mechanism: algorithms (language-model
and environment), advantage estimators, policy losses, KL estimators and loss aggregations
(algorithms/settings.py), rollout backends, environments, agent environments, tools,
reward templates and scorers. One place for register / look-up / capabilities / "did you
mean" / import paths.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import MappingProxyType, ModuleType
from typing import Any, Generic, TypeVar

from hybridflow.errors import ConfigError

T = TypeVar("T")


def definition_site(obj: object) -> str:
    """module.qualname of a class or function (what "the same definition" compares)."""
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"


def split_import_path(path: str) -> tuple[str, str] | None:
    """("package.module", "attr") of "package.module:attr" or "package.module.attr"; None
    when `path` is neither."""
    if not isinstance(path, str):
        return None
    module, sep, attr = path.partition(":")
    if not sep:
        module, _, attr = path.rpartition(".")
    return (module, attr) if module and attr and ":" not in attr else None


def import_path_module(path: str, key: str | None = None, what: str = "object") -> tuple[ModuleType, str]:
    """The module of an import path "package.module:attr" (or "package.module.attr"),
    imported, and the `attr` after it; a ConfigError keyed `key` naming what is wrong
    otherwise. Importing the module runs its registrations (a registry's "module:name")."""
    parts = split_import_path(path)
    if parts is None:
        raise ConfigError(f"{path!r} is not an import path; write {what} as 'package.module:name'", key)
    module_name, attr = parts
    try:
        return importlib.import_module(module_name), attr
    except ImportError as err:
        raise ConfigError(f"cannot import {what} {path!r}: {err}; the module must be importable (installed, or on "
                          "PYTHONPATH, in the controller and in every worker process)", key) from None


def import_object(path: str, key: str | None = None, what: str = "object") -> Any:
    """The object at an import path "package.module:attr" (or "package.module.attr"),
    importing the module; a ConfigError keyed `key` naming what is wrong otherwise."""
    module, attr = import_path_module(path, key, what)
    if not hasattr(module, attr):
        raise ConfigError(f"cannot import {what} {path!r}: module {module.__name__!r} has no {what} {attr!r}", key)
    return getattr(module, attr)


def import_file(path: Path, prefix: str, name: str | None = None) -> ModuleType:
    """The .py file `path` imported once per process as its own module, named `prefix` + its
    stem + a hash of its path (two files both called algo.py do not clash), or `name`. A file
    whose import raises leaves no module behind; the error propagates."""
    path = path.resolve()
    name = name or f"{prefix}{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:10]}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot import {str(path)!r} as a Python module; is it a .py file?")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # before running it: dataclasses look their module up there
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
    return sys.modules[name]


def suggest(name: object, options: list[str]) -> list[str]:
    """The known names closest to a misspelt `name`: by similarity, else those that are a
    prefix of it or that it is a prefix of ("enviroment" -> "env")."""
    if not isinstance(name, str):
        return []
    close = difflib.get_close_matches(name, options, n=3, cutoff=0.5)
    if close:
        return close
    lowered = name.lower()
    return [o for o in options if len(o) >= 3 and (lowered.startswith(o.lower()) or o.lower().startswith(lowered))][:3]


class Registry(Generic[T]):
    def __init__(self, kind: str, config_key: str | None = None, builtins: Mapping[str, str] | None = None, *,
                 rows: bool = False, identity: Callable[[T], str] = definition_site) -> None:
        self.kind = kind  # "environment", "reward template", ... (for messages)
        self.config_key = config_key  # the setting that names an entry (for `get`'s error)
        self.builtins: dict[str, str] = dict(builtins or {})  # name -> the module that registers it
        self.rows = rows  # entries are rows (specs), not classes or functions
        self.identity = identity
        self._items: dict[str, T] = {}
        self._capabilities: dict[str, dict[str, Any]] = {}

    def add(self, name: str, obj: T, *, override: bool = False, **capabilities: Any) -> T:
        """Register `obj` as `name` with optional capability metadata (`capabilities`)."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"a {self.kind} name must be a non-empty string, got {name!r}")
        if not self.rows and not callable(obj):
            raise TypeError(f"{self.kind} {name!r}: {obj!r} is not a class or function")
        known = self._items.get(name)
        if (known is not None and not override and known is not obj
                and self.identity(known) != self.identity(obj)):
            raise ValueError(f"{self.kind} {name!r} is already registered with {self.identity(known)}; "
                             f"choose another name for {self.identity(obj)}, or pass override=True to replace it")
        self._items[name] = obj
        self._capabilities[name] = dict(capabilities)
        return obj

    def register(self, name: str, *, override: bool = False, **capabilities: Any) -> Callable[[T], T]:
        """Decorator: ``@registry.register("name")``."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"a {self.kind} name must be a non-empty string, got {name!r}")
        return lambda obj: self.add(name, obj, override=override, **capabilities)

    def capabilities(self, name: str) -> dict[str, Any]:
        """The capability metadata `name` was registered with (a copy; {} when none)."""
        self.get(name)
        return dict(self._capabilities.get(name, {}))

    def having(self, **wanted: Any) -> list[str]:
        """The loaded names whose capabilities hold every `wanted` key with that value."""
        return sorted(n for n, caps in self._capabilities.items()
                      if all(k in caps and caps[k] == v for k, v in wanted.items()))

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (name in self._items or name in self.builtins)

    def folded(self, name: Any) -> Any:
        """`name`, or its lower case when only that is registered: a choice in any case ("PPO" is "ppo")."""
        return name.lower() if isinstance(name, str) and name not in self and name.lower() in self else name

    def __getitem__(self, name: str) -> T:
        return self.get(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def keys(self) -> list[str]:
        """The names (so `dict(registry)` is the name -> entry table, importing built-ins)."""
        return self.names()

    def pop(self, name: str, default: Any = None) -> Any:
        """Unregister `name` (a test's or a notebook's clean-up); its entry, or `default`."""
        self._capabilities.pop(name, None)
        return self._items.pop(name, default)

    def get(self, name: str) -> T:
        """The entry registered under `name`, importing the module of a declared built-in
        first; else the `unknown` ConfigError (keyed by `config_key`)."""
        if isinstance(name, str) and name not in self._items and name in self.builtins:
            importlib.import_module(self.builtins[name])  # its decorator registers `name`
        if isinstance(name, str) and name in self._items:
            return self._items[name]
        raise self.unknown(name, self.config_key)

    def check(self, name: str) -> None:
        """The `unknown` ConfigError unless `name` is registered or a declared built-in;
        imports nothing."""
        if name not in self:
            raise self.unknown(name, self.config_key)

    def copy(self) -> Registry[T]:
        """A registry with the same settings and entries (a test registers into the copy)."""
        twin = Registry(self.kind, self.config_key, self.builtins, rows=self.rows, identity=self.identity)
        twin._items, twin._capabilities = dict(self._items), {k: dict(v) for k, v in self._capabilities.items()}
        return twin

    @property
    def entries(self) -> Mapping[str, T]:
        """A live read-only view of the registered entries, in registration order."""
        return MappingProxyType(self._items)

    def loaded(self) -> dict[str, T]:
        """The entries registered so far (a declared built-in whose module was never
        imported is absent), as a new dict."""
        return dict(self._items)

    def names(self) -> list[str]:
        """Registered and declared built-in names, sorted."""
        return sorted({*self._items, *self.builtins})

    def resolve(self, name: str, key: str, how: str) -> T:
        """A registered name, else an import path "package.module:name" (or
        "package.module.name", `import_object`): the module is imported (registering what
        it registers), then `name` is what it registered under that name, or its
        attribute; else the `unknown` ConfigError."""
        if name in self:
            return self.get(name)
        if split_import_path(name) is None:
            raise self.unknown(name, key, how)
        imported, attr = import_path_module(name, key, self.kind)
        if attr in self._items and getattr(self._items[attr], "__module__", None) == imported.__name__:
            return self._items[attr]
        if not hasattr(imported, attr):
            raise ConfigError(f"cannot import {self.kind} {name!r}: module {imported.__name__!r} registers no "
                              f"{attr!r} and has no such attribute", key)
        return getattr(imported, attr)

    def unknown(self, name: object, key: str | None, how: str = "", candidates: list[str] | None = None) -> ConfigError:
        """The ConfigError for a name that is not registered: the closest known names, what
        is registered, and `how` to give one (candidates: names to suggest, default all)."""
        pool = self.names() if candidates is None else candidates
        close = suggest(name, pool)
        hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        known = ", ".join(self.names()) or "none"
        return ConfigError(f"unknown {self.kind} {name!r}{hint} (known: {known})" + (f"; {how}" if how else ""), key)
