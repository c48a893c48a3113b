"""The fuzzing suite's record: cases run per test and the tests that found something."""

from __future__ import annotations

import pytest

from tests.fuzz.cases import CASES


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not CASES:
        return
    found = [r.nodeid for r in terminalreporter.stats.get("failed", []) if "tests/fuzz/" in r.nodeid]
    per_test = ", ".join(f"{name} {count}" for name, count in sorted(CASES.items()))
    terminalreporter.write_line(f"fuzzing: {sum(CASES.values())} cases run ({per_test}); "
                                f"{len(found)} found: {found or 'none'}")
