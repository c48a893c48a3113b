"""Write benchmarks/README.md: one table per subject folder, built from its results/*.json.

    python -m benchmarks.report           # rewrite benchmarks/README.md
    python -m benchmarks.report --check   # exit 1 if the README is not what the JSON gives

A row per result file: its key figures (the JSON's "key_figures", else its top-level
numbers), the command, the machine and the date the JSON carries ("not recorded" where
it does not). A new benchmark: put the script in a subject folder, have it write
results/<name>.json there (benchmarks.common.provenance.stamp adds command and date),
then rerun the first command.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
README = HERE / "README.md"
NOT_RECORDED = "not recorded"
SUBJECTS = {  # folder: what its benchmarks measure; a folder not listed here is reported after these
    "rl": "Whole RL runs against other frameworks (TRL), async modes, learning proofs.",
    "engines": "Rollout and training engines: generation, training steps, resharding, pipelines.",
    "controller": "The single controller and Ray: call overhead, serialization, start-up, CPU contention.",
    "envs": "Environment RL (PPO, SAC) against Stable-Baselines3.",
    "planner": "The placement planner: search time, predicted against measured step times.",
    "gpu": "Checks run on a GPU machine.",
    "code": "The source itself: line counts and docstrings.",
}
INTRO = """# Benchmarks

Scripts that measure hybridflow, grouped by subject. Each prints a table and writes one
JSON result under `<subject>/results/` with the command, the machine and the date; the
tables below are generated from those files (`python -m benchmarks.report`, checked by
`tests/benchmarks/test_report.py`), so do not edit this page by hand. Ratios are measured
side by side in one run; the development machine is shared, so absolute times follow its
load (each JSON records it). Older results are in git history.
"""
SKIP_KEYS = {"machine", "command", "date", "note", "what", "how", "args", "benchmark", "key_figures"}


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_short(v) for v in value[:4]) + (", ..." if len(value) > 4 else "") + "]"
    return str(value)


def key_figures(record: dict[str, Any], limit: int = 4) -> str:
    """The JSON's own "key_figures", else its first top-level scalars (one level into dicts)."""
    figures = record.get("key_figures")
    if isinstance(figures, dict):
        limit = len(figures)
    else:
        figures = {}
        for key, value in record.items():
            if key in SKIP_KEYS or key.startswith("load_avg"):
                continue
            if isinstance(value, (int, float)):
                figures[key] = value
            elif isinstance(value, dict):
                figures.update({f"{key}.{k}": v for k, v in value.items() if isinstance(v, (int, float))})
            if len(figures) >= limit:
                break
    return "; ".join(f"{k} {_short(v)}" for k, v in list(figures.items())[:limit]) or NOT_RECORDED


def machine_text(record: dict[str, Any]) -> str:
    machine = record.get("machine")
    if isinstance(machine, str):
        return machine
    if not isinstance(machine, dict):
        return NOT_RECORDED
    parts = [str(machine.get("gpu") or machine.get("cpu") or machine.get("platform") or "")]
    if machine.get("cores"):
        parts.append(f"{machine['cores']} cores")
    if machine.get("memory_gib"):
        parts.append(f"{machine['memory_gib']} GiB")
    return ", ".join(p for p in parts if p) or NOT_RECORDED


def date_text(record: dict[str, Any]) -> str:
    """The JSON's "date", else the time it recorded under an older key ("when_utc", machine "time")."""
    machine = record.get("machine")
    older = machine.get("time") if isinstance(machine, dict) else None
    return str(record.get("date") or record.get("when_utc") or older or NOT_RECORDED)


def cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def subject_table(folder: Path) -> list[str]:
    lines = ["| benchmark | key figures | command | machine | date |", "|---|---|---|---|---|"]
    for path in sorted((folder / "results").glob("*.json")):
        record = json.loads(path.read_text())
        if not isinstance(record, dict):
            record = {"key_figures": {"entries": len(record)}}
        command = record.get("command") or NOT_RECORDED
        lines.append(f"| [{path.stem}](./{folder.name}/results/{path.name}) | {cell(key_figures(record))} | "
                     f"`{cell(command)}` | {cell(machine_text(record))} | {cell(date_text(record))} |")
    return lines


def render() -> str:
    folders = [HERE / name for name in SUBJECTS if (HERE / name).is_dir()]
    folders += sorted(p for p in HERE.iterdir() if p.is_dir() and p.name not in SUBJECTS and (p / "results").is_dir())
    out = [INTRO]
    for folder in folders:
        if not (folder / "results").is_dir():
            continue
        out += [f"## {folder.name}/", "", SUBJECTS.get(folder.name, "") or f"Results under {folder.name}/results/.", ""]
        out += subject_table(folder) + [""]
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args()
    text = render()
    if args.check:
        if README.is_file() and README.read_text() == text:
            return 0
        print("benchmarks/README.md is stale: run `python -m benchmarks.report`", file=sys.stderr)
        return 1
    README.write_text(text)
    print(f"wrote {README}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
