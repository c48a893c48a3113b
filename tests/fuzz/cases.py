"""How many cases each fuzzing test ran: `counted` wraps a test body (under @given), the
conftest prints the totals and the failing tests at the end of the session."""

from __future__ import annotations

import functools
from collections import Counter
from typing import Any, Callable

CASES: Counter[str] = Counter()


def counted(test: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> Any:
        CASES[test.__name__] += 1
        return test(*args, **kwargs)

    return run
