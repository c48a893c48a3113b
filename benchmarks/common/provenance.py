"""The command and date every benchmark result carries (the machine comes from machine()).

    record = stamp({"machine": machine(), ...})   # adds "command" and "date" unless set
"""

from __future__ import annotations

import datetime
import shlex
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def command_line() -> str:
    """This process's command line, the script path relative to the repository root."""
    script = Path(sys.argv[0]).resolve()
    shown = str(script.relative_to(ROOT)) if script.is_relative_to(ROOT) else sys.argv[0]
    return " ".join(["python", shlex.quote(shown), *(shlex.quote(a) for a in sys.argv[1:])])


def stamp(record: dict[str, Any]) -> dict[str, Any]:
    """`record` with "command" and "date" (UTC, to the minute) added where it has none."""
    record.setdefault("command", command_line())
    record.setdefault("date", datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))
    return record
