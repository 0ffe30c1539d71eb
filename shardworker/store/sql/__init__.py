"""Named runtime queries, loaded once from ``queries.sql``, in the schema in use.

Each block starts with a ``-- name --`` line and a one-line ``-- description``; the SQL
runs to the next header. No runtime SQL is built with string formatting but one rewrite:
the queries and the migrations name the schema ``shardworker``, and an application that
keeps its jobs in a schema of its own (``--schema``, ``SHARDWORKER_SCHEMA``, the client's
``schema=``: several apps on one database) gets them with that name instead, in its
tables' names (``app2.jobs``), its notification channels (``app2_jobs``) and its lock
keys (``in_schema``). The schema in use is the process's (``set_schema``, read from
``SHARDWORKER_SCHEMA`` at start) unless a block says otherwise (``using_schema``).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from functools import cache
from pathlib import Path

import psycopg
from psycopg.types.array import ListBinaryDumper

from shardworker.core.config import DEFAULT_SCHEMA, check_schema

_HEADER = re.compile(r"^-- ([a-z0-9_]+) --$", re.MULTILINE)
SCHEMA_ENV = "SHARDWORKER_SCHEMA"
_process_schema: list[str | None] = [None]  # set_schema's; None: the environment's, else the default
_checked: dict[str, str] = {}  # the environment's values checked so far
_block_schema: ContextVar[str | None] = ContextVar("shardworker_schema", default=None)
# The schema's name where the SQL says it: a table or function ("shardworker.jobs", quoted
# when renamed, so that any checked name parses), a channel or lock key ("shardworker_jobs"),
# a catalog lookup ('shardworker'), and migration 0001's CREATE SCHEMA.
_NAMED = re.compile(r"\bshardworker(\.|_|')|(?<=SCHEMA IF NOT EXISTS )shardworker\b")


def current_schema() -> str:
    """The schema this code's SQL names now: a ``using_schema`` block's, else the process's."""
    block = _block_schema.get()
    if block is not None:
        return block
    chosen = _process_schema[0]
    if chosen is not None:
        return chosen
    named = os.environ.get(SCHEMA_ENV) or DEFAULT_SCHEMA
    found = _checked.get(named)
    if found is None:
        found = _checked[named] = check_schema(named, SCHEMA_ENV)
    return found


def set_schema(name: str | None) -> Callable[[], None]:
    """Use schema ``name`` in this process and the processes it starts (through the
    environment; None: as the environment says); the name is checked (``ConfigError``).
    Returns what puts back the schema and the environment as they were (a command run
    in-process, as tests run them, must not leave its process in another schema)."""
    before, before_env = _process_schema[0], os.environ.get(SCHEMA_ENV)
    checked = None if name is None else check_schema(name)
    _process_schema[0] = checked
    if checked is not None:
        os.environ[SCHEMA_ENV] = checked

    def restore() -> None:
        _process_schema[0] = before
        if before_env is None:
            os.environ.pop(SCHEMA_ENV, None)
        else:
            os.environ[SCHEMA_ENV] = before_env

    return restore


@contextlib.contextmanager
def using_schema(name: str | None) -> Iterator[None]:
    """Within the block (this thread or task only), SQL names schema ``name`` (None: as before)."""
    if name is None:
        yield
        return
    token = _block_schema.set(check_schema(name))
    try:
        yield
    finally:
        _block_schema.reset(token)


def in_schema(sql: str, schema: str) -> str:
    """``sql``, written for the schema ``shardworker``, for ``schema``: its tables, functions,
    channels and lock keys renamed (a checked name: lowercase letters, digits, underscores)."""
    if schema == DEFAULT_SCHEMA:
        return sql

    def renamed(found: re.Match[str]) -> str:
        if found[1] is None:  # CREATE SCHEMA
            return f'"{schema}"'
        return f'"{schema}".' if found[1] == "." else schema + found[1]

    return _NAMED.sub(renamed, sql)


def channel(name: str) -> str:
    """A notification channel of the schema in use: ``shardworker_jobs`` for ``jobs``."""
    return f"{current_schema()}_{name}"


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
def queries(schema: str = DEFAULT_SCHEMA) -> dict[str, str]:
    text = (Path(__file__).parent / "queries.sql").read_text(encoding="utf-8")
    return parse_queries(in_schema(text, schema))


def query(name: str) -> str:
    """The SQL of one named query, in the schema in use; KeyError names the missing query."""
    return queries(current_schema())[name]


_PLACEHOLDER = re.compile(r"%(?:\((\w+)\)[sbt]|(%))")


def native(name: str) -> tuple[str, tuple[str, ...]]:
    """One named query with PostgreSQL's own placeholders (``to_native``), in the schema in use."""
    return _native(name, current_schema())


@cache
def _native(name: str, schema: str) -> tuple[str, tuple[str, ...]]:
    return to_native(queries(schema)[name])


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
