"""Checks shared by the trainer tests (imported as a top-level module, like the other
test directories' helpers)."""

from __future__ import annotations

import math
from pathlib import Path

from hybridflow.trainer.run_dir import read_metrics


def rl_records(run_dir: Path) -> list[dict]:
    return [r for r in read_metrics(run_dir / "metrics.jsonl") if r["phase"] == "rl"]


def assert_finite(record: dict) -> None:
    """Every metric of a metrics.jsonl record is a finite number (non-finite are written as null)."""
    bad = {k: v for k, v in record.items() if k not in ("phase",) and not (
        isinstance(v, (int, float)) and math.isfinite(v))}
    assert not bad, f"non-finite metrics at step {record['step']}: {bad}"
