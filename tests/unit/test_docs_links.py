"""The documentation holds together: README.md stays short, and every relative link in it
and in docs/*.md reaches a file of the repository (and a heading there, for ``#anchor``).

Anchors are GitHub's heading slugs: lower case, punctuation other than ``-`` and ``_``
dropped, spaces turned into ``-``, and ``-1``, ``-2`` ... appended to repeated headings.
Code blocks and inline code are not read for links or headings.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from urllib.parse import unquote

import pytest

REPO = Path(__file__).resolve().parents[2]
README_LIMIT_BYTES = 8192
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

_FENCE = re.compile(r"^\s*(```|~~~)")
_INLINE_CODE = re.compile(r"`+[^`]*`+")
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE = re.compile(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto: ...


def prose_lines(path: Path) -> list[str]:
    """The file's lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text (before duplicates are numbered)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    text = re.sub(r"<[^>]+>", "", text).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    """Every anchor the headings of a markdown file define."""
    seen: dict[str, int] = {}
    found = set()
    for line in prose_lines(path):
        if m := _HEADING.match(line):
            base = slug(m.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return frozenset(found)


def links(path: Path) -> list[str]:
    """The link and image targets of a markdown file, in order."""
    found = []
    for line in map(lambda text: _INLINE_CODE.sub("", text), prose_lines(path)):
        found += _LINK.findall(line)
        if m := _REFERENCE.match(line):
            found.append(m.group(1))
    return found


def problems(path: Path, root: Path = REPO) -> list[str]:
    """What is wrong with the relative links of one file of ``root``, one line each."""
    wrong = []
    for target in links(path):
        if _EXTERNAL.match(target):
            continue
        where, _, anchor = target.partition("#")
        if where.startswith("/") or ".." in Path(unquote(where)).parts:
            wrong.append(f"{target}: leaves the repository (or names a machine path)")
            continue
        file = (path.parent / unquote(where)).resolve() if where else path
        if not file.is_relative_to(root) or not file.exists():
            wrong.append(f"{target}: no such file in the repository")
        elif anchor and (file.suffix != ".md" or unquote(anchor) not in anchors(file)):
            wrong.append(f"{target}: no heading with that anchor in {file.relative_to(root)}")
    return wrong


def test_readme_is_under_8_kib() -> None:
    """README.md stays a front page: under 8192 bytes; the rest lives in docs/."""
    size = (REPO / "README.md").stat().st_size
    assert size < README_LIMIT_BYTES, f"README.md is {size} bytes; move sections into docs/"


@pytest.mark.parametrize("path", DOCS, ids=[str(p.relative_to(REPO)) for p in DOCS])
def test_relative_links_reach_files_and_headings(path: Path) -> None:
    """Every relative link of the file names a file of the repository, and a heading of it
    when it has an anchor; none goes through ``..`` or starts at ``/``."""
    assert links(path) or path.name != "README.md", "README.md links nothing: the docs index is missing"
    assert problems(path) == []


def test_the_checks_can_fail(tmp_path: Path) -> None:
    """The checks find each kind of broken link in a small sample, and compute GitHub's slugs."""
    assert slug("Names, keys and the database's refusals") == "names-keys-and-the-databases-refusals"
    assert slug("`--exit-when-idle` and retries") == "--exit-when-idle-and-retries"
    sample = tmp_path / "sample.md"
    sample.write_text("# Top\n## Top\n\n[a](../x.md) [b](missing.md) [c](#nowhere) [d](#top-1) [e](https://example.com)"
                      " ![f](/etc/passwd)\n```\n[g](inside-a-code-block.md)\n```\n`[h](inline.md)`\n", encoding="utf-8")
    assert links(sample) == ["../x.md", "missing.md", "#nowhere", "#top-1", "https://example.com", "/etc/passwd"]
    assert [p.split(":")[0] for p in problems(sample, tmp_path)] == ["../x.md", "missing.md", "#nowhere", "/etc/passwd"]
