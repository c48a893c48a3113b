"""Docstring lines of a source tree: module docstrings and all docstrings.

    python benchmarks/code/docstring_lines.py [--root hybridflow] [--top 10] [--rev REV] [--baseline REV]

Checks the house rule (module docstrings of at most ~10 lines): prints the totals, the
average module docstring and the longest ones; writes code/results/docstring_lines.json.
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the root, for benchmarks.*
from benchmarks.common.provenance import stamp  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def docstring_lines(source: str) -> tuple[int, int]:
    """(module docstring lines, all docstring lines) of one file's source."""
    module = total = 0
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        first = node.body[0] if node.body else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
            lines = first.end_lineno - first.lineno + 1
            total += lines
            module = lines if isinstance(node, ast.Module) else module
    return module, total


def sources(root: str, rev: str | None) -> dict[str, str]:
    """path -> source of the tree's .py files, from the work tree or from git at `rev`."""
    if rev is None:
        return {str(p.relative_to(ROOT)): p.read_text() for p in sorted((ROOT / root).rglob("*.py"))}
    names = subprocess.run(["git", "ls-tree", "-r", "--name-only", rev, root], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout.split()
    return {n: subprocess.run(["git", "show", f"{rev}:{n}"], cwd=ROOT, check=True, capture_output=True,
                              text=True).stdout for n in names if n.endswith(".py")}


def measure(files: dict[str, str]) -> dict:
    per_file = {path: docstring_lines(text) for path, text in files.items()}
    modules = [m for m, _ in per_file.values() if m]
    return {"files": len(per_file), "module_docstrings": len(modules), "module_docstring_lines": sum(modules),
            "module_docstring_average": round(sum(modules) / max(len(modules), 1), 1),
            "module_docstrings_over_10_lines": sum(1 for m in modules if m > 10),
            "longest": sorted(((m, p) for p, (m, _) in per_file.items()), reverse=True)[:10],
            "docstring_lines": sum(t for _, t in per_file.values())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default="hybridflow")
    parser.add_argument("--rev", default=None, help="measure this git revision instead of the work tree")
    parser.add_argument("--baseline", default=None, help="also measure this revision, for a before/after row")
    parser.add_argument("--top", type=int, default=10)
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "docstring_lines.json"))
    args = parser.parse_args()
    result = measure(sources(args.root, args.rev))
    print(f"{result['files']} files; module docstrings: {result['module_docstring_lines']} lines, average "
          f"{result['module_docstring_average']}, {result['module_docstrings_over_10_lines']} over 10 lines; "
          f"all docstrings: {result['docstring_lines']} lines")
    for lines, path in result["longest"][:args.top]:
        print(f"{lines:5}  {path}")
    key = {k: result[k] for k in ("module_docstring_average", "module_docstring_lines", "docstring_lines",
                                  "module_docstrings_over_10_lines")}
    if args.baseline:
        before = measure(sources(args.root, args.baseline))
        key |= {f"at {args.baseline}: {k}": before[k] for k in ("module_docstring_average", "docstring_lines")}
    record = stamp({"root": args.root, "rev": args.rev or "work tree", **result, "key_figures": key,
                    "machine": "not relevant (counts source lines)"})
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
