"""Named runtime queries, loaded once from ``queries.sql``.

Each block starts with a ``-- name --`` line and a one-line ``-- description``; the SQL
runs to the next header. No runtime SQL is built with string formatting.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import psycopg
from psycopg.types.array import ListBinaryDumper

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


_PLACEHOLDER = re.compile(r"%(?:\((\w+)\)[sbt]|(%))")


@cache
def native(name: str) -> tuple[str, tuple[str, ...]]:
    """One named query with PostgreSQL's own placeholders (``to_native``)."""
    return to_native(query(name))


def to_native(sql: str) -> tuple[str, tuple[str, ...]]:
    """``sql`` with PostgreSQL's own placeholders ($1, $2, ...: one per parameter name,
    numbered in order of first use) and those names, for ``psycopg.RawCursor``, which
    sends the text as it is and picks each parameter's format itself (as ``%s`` does; a
    ``%b`` gives up its binary: PostgreSQL takes either). psycopg parses a ``%(name)s``
    query on every execute once it is longer than 4,096 characters, as the claim (9,668)
    and the apply (4,750) are: a fifth of the parent's CPU for each claim. A list goes as text
    then, unless it is a ``BinaryList``."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match[2]:
            return "%"  # %% is a literal percent sign
        if match[1] not in names:
            names.append(match[1])
        return f"${names.index(match[1]) + 1}"

    return _PLACEHOLDER.sub(number, sql), tuple(names)


def native_params(name: str, params: dict[str, object]) -> list[object]:
    """``params`` in the order of ``native(name)``'s placeholders; KeyError names one missing."""
    return [params[key] for key in native(name)[1]]


class BinaryList(list):  # type: ignore[type-arg]
    """A list a ``psycopg.RawCursor`` sends in binary, as ``%b`` would. For results (``bytea``
    holding the child's JSON): as text, each would go in hex, twice its size, after an escape
    pass over it (a 55 MB result took the flusher 1.2 s before PostgreSQL saw it)."""


psycopg.adapters.register_dumper(BinaryList, ListBinaryDumper)
