"""Every link and image in the README, DEVELOPERS.md, docs/ and benchmarks/README.md resolves inside a
fresh clone: relative file links name a file or folder of the repository, and anchors name a
heading of their page (GitHub's heading slugs); the README's index names every docs page."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted(p for p in [ROOT / "README.md", ROOT / "DEVELOPERS.md", ROOT / "benchmarks" / "README.md",
                           *(ROOT / "docs").glob("*.md")] if p.exists())
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
CODE_SPAN = re.compile(r"`[^`\n]*`")


def prose(page: Path) -> str:
    """The page without fenced code blocks (links there are code, not links)."""
    return FENCE.sub("", page.read_text(encoding="utf-8"))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for heading in re.findall(r"^#{1,6}\s+(.*?)\s*#*$", prose(page), flags=re.M):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in LINK.findall(CODE_SPAN.sub("", prose(page))):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        resolved = (page.parent / path_part).resolve() if path_part else page
        if not resolved.is_relative_to(ROOT):
            broken.append(f"{target} (leaves the repository)")
        elif not resolved.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target} (no heading #{anchor} in {resolved.relative_to(ROOT)})")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_resolves_inside_the_repository(page):
    assert not broken_links(page), broken_links(page)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_sends_readers_outside_the_repository(page):
    outside = re.findall(r"`(\.\./[^`\s]*\.md)`", prose(page))
    assert not outside, f"{outside}: a fresh clone has no such file"


def test_the_checker_finds_a_broken_link_and_a_missing_anchor(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "a.md").write_text("# Title here\n\n[ok](#title-here) [gone](b.md) [bad](#nope) "
                                   "[out](../x.md)\n\n```\n[code](c.md)\n```\n")
    assert broken_links(tmp_path / "a.md") == ["b.md (no such file)", "#nope (no heading #nope in a.md)",
                                               "../x.md (leaves the repository)"]


def test_the_readme_indexes_every_docs_page():
    index = (ROOT / "README.md").read_text(encoding="utf-8").split("## Documentation", 1)[1]
    linked = set(re.findall(r"\]\(docs/([\w-]+\.md)\)", index))
    assert linked == {p.name for p in (ROOT / "docs").glob("*.md")}
