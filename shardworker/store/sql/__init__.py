"""Named runtime queries, loaded once from ``queries.sql``.

Each block starts with a ``-- name --`` line and a one-line ``-- description``; the SQL
runs to the next header. No runtime SQL is built with string formatting.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

_HEADER = re.compile(r"^-- ([a-z0-9_]+) --$", re.MULTILINE)


def parse_queries(text: str) -> dict[str, str]:
    """Map each block's name to its SQL (comments kept, surrounding blank lines dropped)."""
    parts = _HEADER.split(text)
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise ValueError(f"duplicate query name {name!r} in queries.sql")
        queries[name] = body.strip()
    return queries


@cache
def queries() -> dict[str, str]:
    return parse_queries((Path(__file__).parent / "queries.sql").read_text(encoding="utf-8"))


def query(name: str) -> str:
    """The SQL of one named query; KeyError names the missing query."""
    return queries()[name]
