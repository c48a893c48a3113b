"""The commit-message check in .githooks/commit-msg accepts the house form and refuses the rest."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

HOOK = Path(__file__).resolve().parents[1] / ".githooks" / "commit-msg"
GOOD = """Bind gloo to the interface of the worker's Ray node IP

The hostname resolves to 127.0.1.1 on Debian-like hosts, so a
two-node run failed at its first collective.
"""


def check(tmp_path: Path, message: str) -> subprocess.CompletedProcess:
    path = tmp_path / "COMMIT_EDITMSG"
    path.write_text(message)
    return subprocess.run([sys.executable, str(HOOK), str(path)], capture_output=True, text=True)


@pytest.mark.parametrize("message", [
    GOOD,
    GOOD + "# Please enter the commit message for your changes.\n#\n",  # git's template comments
    "Merge branch 'docs' into main\n",  # merges may have no body
    "x" * 72 + "\n\nA body.\n",
])
def test_good_messages_pass(tmp_path, message):
    result = check(tmp_path, message)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(("message", "complaint"), [
    ("", "subject line is empty"),
    ("x" * 73 + "\n\nA body.\n", "73 characters"),
    ("Fix the loader\nno blank line here\n", "second line must be blank"),
    ("Fix the loader\n", "body is missing"),
    ("Fix the loader\n\n# only a comment\n\n", "body is missing"),
    ("Fix the loader as the helper asked\n\nBody.\n", "'helper'"),
    ("Fix the loader\n\nrevB's 1de279d keyed it.\n", "'revB'"),
    ("Fix the loader\n\nFound at stop 12.\n", "'stop 12'"),
    ("Fix the loader\n\nSecond round 3 result.\n", "'round 3'"),
    ("Fix the loader\n\nSee issue23_before_after.json.\n", "'issue23_'"),
])
def test_bad_messages_are_refused_with_the_reason(tmp_path, message, complaint):
    result = check(tmp_path, message)
    assert result.returncode == 1 and complaint in result.stderr, result.stderr
