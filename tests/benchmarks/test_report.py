"""benchmarks/README.md is what `python -m benchmarks.report` makes of the result JSON."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import report

ROOT = Path(__file__).resolve().parents[2]


def test_readme_is_current():
    assert (ROOT / "benchmarks" / "README.md").read_text() == report.render(), (
        "benchmarks/README.md is stale: run `python -m benchmarks.report`")


def test_every_result_carries_command_machine_and_date():
    records = {path.relative_to(ROOT): json.loads(path.read_text())
               for path in sorted(ROOT.glob("benchmarks/*/results/*.json"))}
    missing = [f"{path}: {key}" for path, record in records.items()
               for key in ("command", "machine") if key not in record]
    missing += [f"{path}: date" for path, record in records.items() if report.date_text(record) == report.NOT_RECORDED]
    assert not missing, missing


def test_a_new_subject_folder_gets_its_table(tmp_path, monkeypatch):
    (tmp_path / "newsubject" / "results").mkdir(parents=True)
    (tmp_path / "newsubject" / "results" / "probe.json").write_text(json.dumps(
        {"command": "python benchmarks/newsubject/probe.py", "date": "2026-01-01 00:00 UTC",
         "machine": {"cpu": "Some CPU", "cores": 2, "memory_gib": 4.0}, "key_figures": {"ratio": 1.5}}))
    monkeypatch.setattr(report, "HERE", tmp_path)
    text = report.render()
    assert "## newsubject/" in text
    assert ("| [probe](./newsubject/results/probe.json) | ratio 1.5 | `python benchmarks/newsubject/probe.py` | "
            "Some CPU, 2 cores, 4.0 GiB | 2026-01-01 00:00 UTC |") in text
