"""Lazy package exports: `from hybridflow.algorithms import compute_grpo` imports only the
module that defines it, so importing one light module of a package (a config class, a
registry) does not import torch through the package's `__init__`.

    # in a package's __init__.py
    __getattr__, __dir__ = lazy_exports(__name__, {"compute_grpo": "group_advantages",
                                                   "ARITHMETIC_DATA_SOURCE": "arithmetic:DATA_SOURCE"})

A value is "module" (the same name in hybridflow.<package>.<module>) or "module:attr".
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def lazy_exports(package: str, table: Mapping[str, str], eager: Iterable[str] = ()
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """Module-level `__getattr__` and `__dir__` that import `table`'s names on first use
    (`eager`: the names the package imports itself, listed by `__dir__` too)."""
    listed = sorted({*table, *eager})

    def __getattr__(name: str) -> Any:
        if name not in table:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, _, attr = table[name].partition(":")
        return getattr(importlib.import_module(f"{package}.{module}"), attr or name)

    def __dir__() -> list[str]:
        return list(listed)

    return __getattr__, __dir__
