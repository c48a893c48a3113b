"""Name -> function registries, so the trainer picks estimators and losses from config.

Every pluggable piece of the math layer (advantage estimators, policy losses, loss
aggregation modes, KL estimators) lives in a `Registry`. Users add their own with the
module's `register_*` decorator; the trainer resolves config strings with `get_*`. An
unknown name raises `ValueError` naming the config key, every known name and the
closest match, because a typo in a YAML file is the usual cause.

Built-in entries are *declared* by name with the module that registers them
(`builtins={"grpo": "hybridflow.algorithms.group_advantages"}`): `check(name)` and
`names()` answer from that table without importing the module (config validation runs
before torch is imported), and `get(name)` imports it on first use.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Mapping
from typing import Callable, Generic, TypeVar

F = TypeVar("F", bound=Callable)


class Registry(Generic[F]):
    """A named table of functions of one kind (e.g. advantage estimators)."""

    def __init__(self, kind: str, config_key: str, builtins: Mapping[str, str] | None = None) -> None:
        self.kind = kind
        self.config_key = config_key
        self._table: dict[str, F] = {}
        self.builtins: dict[str, str] = dict(builtins or {})  # name -> the module that registers it

    def register(self, name: str, *, override: bool = False) -> Callable[[F], F]:
        """Decorator that stores `fn` under `name`; re-registering needs `override=True`."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} name must be a non-empty string, got {name!r}")

        def decorator(fn: F) -> F:
            if name in self._table and not override and self._table[name] is not fn:
                raise ValueError(
                    f"{self.kind} {name!r} is already registered "
                    f"(by {self._table[name].__module__}.{self._table[name].__qualname__}); "
                    "pass override=True to replace it"
                )
            self._table[name] = fn
            return fn

        return decorator

    def get(self, name: str) -> F:
        """The function registered under `name` (importing the module of a declared
        built-in first); ValueError with suggestions if unknown."""
        if isinstance(name, str) and name not in self._table and name in self.builtins:
            importlib.import_module(self.builtins[name])  # its decorator registers `name`
        try:
            return self._table[name]
        except (KeyError, TypeError):
            raise ValueError(self._unknown_message(name)) from None

    def check(self, name: str) -> None:
        """ValueError with suggestions unless `name` is registered or a declared built-in;
        imports nothing."""
        if name not in self:
            raise ValueError(self._unknown_message(name))

    def names(self) -> list[str]:
        """All registered and declared built-in names, sorted."""
        return sorted({*self._table, *self.builtins})

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (name in self._table or name in self.builtins)

    def _unknown_message(self, name: object) -> str:
        known = self.names()
        msg = f"unknown {self.kind} {name!r} (config key `{self.config_key}`); known: {', '.join(known)}"
        if isinstance(name, str):
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
            if close:
                msg += f". Did you mean {close[0]!r}?"
        return msg
