"""Named registries shared by every layer's extension points (environments, agent
environments, reward templates): one place for register / look-up / "did you mean".

    ENVS = Registry("environment")
    ENVS.add("my-env", MyEnv)                 # or @ENVS.register("my-env")
    ENVS["my-env"], "my-env" in ENVS, ENVS.names()
    ENVS.resolve("pkg.mod:MyEnv", "env.id", how)   # a registered name or an import path
    raise ENVS.unknown("myenv", "env.id", "give a registered name or 'package.module:Class'")

Like errors.py, this module imports nothing from hybridflow but `errors`, so any layer may
use it without breaking ARCHITECTURE.md's layer order. Registering another object under a
taken name raises; the same definition again (a re-run script, a re-imported module makes
a new class object for the same code) replaces it.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable
from typing import Generic, TypeVar

from hybridflow.errors import ConfigError

T = TypeVar("T")


def definition_site(obj: object) -> str:
    """module.qualname of a class or function (what "the same definition" compares)."""
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"


class Registry(Generic[T]):
    def __init__(self, kind: str) -> None:
        self.kind = kind  # "environment", "reward template", ... (for messages)
        self._items: dict[str, T] = {}

    def add(self, name: str, obj: T) -> T:
        if not isinstance(name, str) or not name:
            raise ValueError(f"a {self.kind} name must be a non-empty string, got {name!r}")
        if not callable(obj):
            raise TypeError(f"{self.kind} {name!r}: {obj!r} is not a class or function")
        known = self._items.get(name)
        if known is not None and known is not obj and definition_site(known) != definition_site(obj):
            raise ValueError(f"{self.kind} {name!r} is already registered to {definition_site(known)}; "
                             "pick another name")
        self._items[name] = obj
        return obj

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: ``@registry.register("name")``."""
        return lambda obj: self.add(name, obj)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __getitem__(self, name: str) -> T:
        return self._items[name]

    def names(self) -> list[str]:
        return sorted(self._items)

    def resolve(self, name: str, key: str, how: str) -> T:
        """A registered name, else an import path "package.module:name" (or
        "package.module.name"): the module is imported (registering what it registers), then
        `name` is what it registered under that name, or its attribute; else the `unknown`
        ConfigError."""
        if name in self._items:
            return self._items[name]
        module, sep, attr = name.partition(":")
        if not sep:
            module, _, attr = name.rpartition(".")
        if not module:
            raise self.unknown(name, key, how)
        try:
            imported = importlib.import_module(module)
        except ImportError as err:
            raise ConfigError(f"cannot import {self.kind} {name!r}: {err}", key) from None
        if attr in self._items and getattr(self._items[attr], "__module__", None) == imported.__name__:
            return self._items[attr]
        if not hasattr(imported, attr):
            raise ConfigError(f"cannot import {self.kind} {name!r}: module {module!r} registers no {attr!r} and has "
                              "no such attribute", key)
        return getattr(imported, attr)

    def unknown(self, name: str, key: str, how: str, candidates: list[str] | None = None) -> ConfigError:
        """The ConfigError for a name that is not registered: the closest known names, what
        is registered, and `how` to give one (candidates: names to suggest, default all)."""
        pool = self.names() if candidates is None else candidates
        close = difflib.get_close_matches(name, pool, n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        return ConfigError(f"unknown {self.kind} {name!r}{hint} (registered: {self.names() or 'none'}); {how}", key)
