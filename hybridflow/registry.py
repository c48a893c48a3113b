"""Named registries for every extension point: advantage estimators, policy losses, KL
estimators and loss aggregations (algorithms/settings.py), rollout backends, environments,
agent environments and reward templates. One place for register / look-up / "did you mean".

    ENVS = Registry("environment")
    ENVS.add("my-env", MyEnv)                 # or @ENVS.register("my-env")
    ENVS["my-env"], "my-env" in ENVS, ENVS.names()
    ENVS.resolve("pkg.mod:MyEnv", "env.id", how)   # a registered name or an import path
    raise ENVS.unknown("myenv", "env.id", "give a registered name or 'package.module:Class'")

    LOSSES = Registry("policy loss", "actor.policy_loss.loss_mode", {"vanilla": "pkg.losses"})
    LOSSES.check("vanilla")                   # imports nothing: config validation runs before torch
    LOSSES.get("vanilla")                     # imports pkg.losses (its decorator registers the name)

Built-in entries may be *declared* by name with the module that registers them
(`builtins`), so `check`/`names` answer without importing it and `get` imports it on first
use. Like errors.py, this module imports nothing from hybridflow but `errors`, so any layer
may use it without breaking ARCHITECTURE.md's layer order. Registering another object
under a taken name needs `override=True`; the same definition again (a re-run script, a
re-imported module makes a new class object for the same code) replaces it.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Mapping
from typing import Generic, TypeVar

from hybridflow.errors import ConfigError

T = TypeVar("T")


def definition_site(obj: object) -> str:
    """module.qualname of a class or function (what "the same definition" compares)."""
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"


class Registry(Generic[T]):
    def __init__(self, kind: str, config_key: str | None = None, builtins: Mapping[str, str] | None = None) -> None:
        self.kind = kind  # "environment", "reward template", ... (for messages)
        self.config_key = config_key  # the setting that names an entry (for `get`'s error)
        self.builtins: dict[str, str] = dict(builtins or {})  # name -> the module that registers it
        self._items: dict[str, T] = {}

    def add(self, name: str, obj: T, *, override: bool = False) -> T:
        if not isinstance(name, str) or not name:
            raise ValueError(f"a {self.kind} name must be a non-empty string, got {name!r}")
        if not callable(obj):
            raise TypeError(f"{self.kind} {name!r}: {obj!r} is not a class or function")
        known = self._items.get(name)
        if (known is not None and not override and known is not obj
                and definition_site(known) != definition_site(obj)):
            raise ValueError(f"{self.kind} {name!r} is already registered to {definition_site(known)}; "
                             "pick another name or pass override=True to replace it")
        self._items[name] = obj
        return obj

    def register(self, name: str, *, override: bool = False) -> Callable[[T], T]:
        """Decorator: ``@registry.register("name")``."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"a {self.kind} name must be a non-empty string, got {name!r}")
        return lambda obj: self.add(name, obj, override=override)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (name in self._items or name in self.builtins)

    def __getitem__(self, name: str) -> T:
        return self.get(name)

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

    def loaded(self) -> dict[str, T]:
        """The entries registered so far (a declared built-in whose module was never
        imported is absent), as a new dict."""
        return dict(self._items)

    def names(self) -> list[str]:
        """Registered and declared built-in names, sorted."""
        return sorted({*self._items, *self.builtins})

    def resolve(self, name: str, key: str, how: str) -> T:
        """A registered name, else an import path "package.module:name" (or
        "package.module.name"): the module is imported (registering what it registers), then
        `name` is what it registered under that name, or its attribute; else the `unknown`
        ConfigError."""
        if name in self:
            return self.get(name)
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

    def unknown(self, name: object, key: str | None, how: str = "", candidates: list[str] | None = None) -> ConfigError:
        """The ConfigError for a name that is not registered: the closest known names, what
        is registered, and `how` to give one (candidates: names to suggest, default all)."""
        pool = self.names() if candidates is None else candidates
        close = difflib.get_close_matches(name, pool, n=3, cutoff=0.5) if isinstance(name, str) else []
        hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        known = ", ".join(self.names()) or "none"
        return ConfigError(f"unknown {self.kind} {name!r}{hint} (known: {known})" + (f"; {how}" if how else ""), key)
