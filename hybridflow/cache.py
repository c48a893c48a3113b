"""Where hybridflow keeps what it measured about this machine (importable from any layer).

$HYBRIDFLOW_CACHE, else $XDG_CACHE_HOME/hybridflow, else ~/.cache/hybridflow; below it one
folder per kind: planner/ (the cost model's calibration, planner/devices.py), precision/
(the bf16-vs-fp32 matmul probe, engines/precision.py), models/ (converted pretrained
models, engines/pretrained.py). Deleting a file makes the next run measure (or convert) again.
"""

from __future__ import annotations

import os
from pathlib import Path


CACHE_ENV = "HYBRIDFLOW_CACHE"


def cache_path(*parts: str) -> Path:
    """The cache root (module docstring) joined with `parts`."""
    if os.environ.get(CACHE_ENV):
        root = Path(os.environ[CACHE_ENV]).expanduser()
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        root = (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "hybridflow"
    return root.joinpath(*parts)
