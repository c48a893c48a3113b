"""Issue 23's size criterion, measured: the lines of trainer/ + config/ + workers/rollout.py
before the redesign (89896a3) and now, and where today's lines come from.

    python benchmarks/code/size_accounting.py              # table + results/size_accounting.json
    python benchmarks/code/size_accounting.py --rev HEAD~3

Each line of the tree at `--rev` is attributed by `git blame -M -C` (moved and copied
lines keep their origin) to the commit that wrote it, and that commit to one of three
sources: the tree before the redesign (an ancestor of the base), a feature another issue
asked for (the commits listed in OTHER_ISSUES, from their messages and the stops' notes),
or issue 23 itself (every other later commit: conservative, a commit of unclear origin
counts against the redesign). The criterion "shrink" needs the sum below the base's total.
Code lines leave out blank lines, comments and docstrings. Needs the repository's history
(a shallow clone has none).
"""

from __future__ import annotations

import argparse
import ast
import collections
import datetime
import io
import json
import subprocess
import tokenize
from pathlib import Path
import sys
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the root, for benchmarks.*
from benchmarks.common.provenance import stamp  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PATHS = ("hybridflow/trainer", "hybridflow/config", "hybridflow/workers/rollout.py")
BASE = "89896a3"  # the last commit before the redesign (issue 23's "before")

# Commits after the base whose lines in PATHS are features other issues asked for.
OTHER_ISSUES = {
    "aa6d735": 24, "212189a": 24, "ec7eff7": 24,  # dtype auto by measurement; the GPU check
    "9c554c2": 25, "0af5fc0": 25, "a33cc36": 25,  # no-signal steps
    "62f2aea": 26, "4741fc8": 26, "66d3af9": 26, "a89760b": 26, "614a145": 26,  # eval, SAC, output, resume
    "8feba2b": 26,  # merge of 'newcomer'
    "25cacc6": 27, "99b5555": 27, "6ada5ff": 27, "755a8cc": 27, "522961c": 27, "cd92158": 27,
    "6feec7a": 27, "650471e": 27, "f9de272": 27, "23c837e": 27,  # hardening (23c837e: its merge)
    "810d644": 28, "0d282ab": 28, "28c2445": 28, "9d9fdf0": 28, "2b1606a": 28,  # speed round three
}


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout


def python_files(rev: str) -> list[str]:
    return [f for f in git("ls-tree", "-r", "--name-only", rev, *PATHS).split() if f.endswith(".py")]


def count_lines(source: str) -> tuple[int, int]:
    """(all lines, code lines): code leaves out blank lines, comments and docstrings."""
    docstrings: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body \
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            docstrings.update(range(body[0].lineno, body[0].end_lineno + 1))
    code: set[int] = set()
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in skip:
            code.update(line for line in range(tok.start[0], tok.end[0] + 1) if line not in docstrings)
    return len(source.splitlines()), len(code)


def totals(rev: str) -> dict[str, int]:
    lines = code = 0
    for path in python_files(rev):
        all_lines, code_lines = count_lines(git("show", f"{rev}:{path}"))
        lines, code = lines + all_lines, code + code_lines
    return {"lines": lines, "code_lines": code}


def sources(rev: str) -> tuple[dict[str, int], list[tuple[int, str]], dict[str, int]]:
    """Lines of `rev` in PATHS by where they come from (module docstring); issue 23's
    commits with their lines, the largest first; and the lines of each base file kept."""
    by_commit: collections.Counter[str] = collections.Counter()
    kept_from: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for path in python_files(rev):
        commit = ""
        for line in git("blame", "-M", "-C", "--line-porcelain", rev, "--", path).splitlines():
            parts = line.split()
            # A header line: <40-hex commit> <line in origin> <line here> [<lines in group>].
            if len(parts) >= 3 and len(parts[0]) == 40 and all(c in "0123456789abcdef" for c in parts[0]):
                commit = parts[0]
                by_commit[commit] += 1
            elif line.startswith("filename "):  # the file the line was written in
                kept_from[commit][line[len("filename "):]] += 1
    counts, redesign, kept = collections.Counter(), [], collections.Counter()
    for commit, lines in by_commit.items():
        ancestor = subprocess.run(["git", "merge-base", "--is-ancestor", commit, BASE], cwd=ROOT).returncode == 0
        issue = next((n for short, n in OTHER_ISSUES.items() if commit.startswith(short)), None)
        origin = "before the redesign" if ancestor else f"issue {issue}" if issue else "issue 23"
        counts[origin] += lines
        if ancestor:
            kept.update(kept_from[commit])
        if origin == "issue 23":
            redesign.append((lines, git("log", "-1", "--format=%h %s", commit).strip()[:100]))
    return dict(sorted(counts.items())), sorted(redesign, reverse=True), dict(kept)


def gone_by_file(kept: dict[str, int]) -> list[tuple[int, int, str]]:
    """(lines gone, lines at the base, path) of each base file in PATHS, the most gone first."""
    rows = [(len(git("show", f"{BASE}:{path}").splitlines()), path) for path in python_files(BASE)]
    return sorted(((total - kept.get(path, 0), total, path) for total, path in rows), reverse=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rev", default="HEAD")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/code/results/size_accounting.json"))
    args = parser.parse_args()
    rev = git("rev-parse", "--short", args.rev).strip()
    before, after = totals(BASE), totals(rev)
    origin, redesign, kept = sources(rev)
    gone = gone_by_file(kept)
    print(f"{'tree':<28}{'lines':>8}{'code lines':>12}")
    print(f"{'before (' + BASE + ')':<28}{before['lines']:>8}{before['code_lines']:>12}")
    print(f"{'now (' + rev + ')':<28}{after['lines']:>8}{after['code_lines']:>12}")
    print(f"\nlines of {rev} by origin")
    for name, lines in origin.items():
        print(f"  {name:<26}{lines:>8}")
    print("\nissue 23's largest commits (lines of them in the tree)")
    for lines, commit in redesign[:8]:
        print(f"  {lines:>5}  {commit}")
    print("\nbase files that lost the most lines (moved or copied lines count as kept)")
    for lines_gone, total, path in gone[:10]:
        print(f"  {lines_gone:>5} of {total:>4}  {path}")
    kept_total = origin.get("before the redesign", 0)
    print(f"\nlines of the base gone: {before['lines'] - kept_total}; the base's lines kept plus other issues' "
          f"features: {after['lines'] - origin.get('issue 23', 0)} (the base had {before['lines']})")
    result = {"base": BASE, "rev": rev, "paths": list(PATHS), "before": before, "after": after,
              "lines_by_origin": origin, "issue_23_commits": [{"lines": n, "commit": c} for n, c in redesign],
              "base_lines_gone_by_file": [{"gone": g, "of": t, "path": p} for g, t, p in gone],
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
              "machine": "not relevant (counts lines from git history)"}
    Path(args.out).write_text(json.dumps(stamp(result), indent=2) + "\n")
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
