"""`Payload`: the stand-in for code planted in a file a run reads back (tests of the loaders
that must refuse it)."""

from __future__ import annotations

from pathlib import Path


class Payload:
    """Unpickling this touches `marker`: if the marker exists, the planted code ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))
