"""The named queries of ``queries.sql``: how ``parse_queries`` reads the file, and that every
``query("name")`` in the store names a described block. No database."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import shardworker.store
from shardworker.store.sql import native, parse_queries, queries, to_native


def test_parse_queries_maps_names_to_stripped_sql() -> None:
    """Each ``-- name --`` block becomes one entry whose SQL runs to the next header."""
    text = "prelude ignored\n-- one --\n-- first\nSELECT 1;\n\n-- two_2 --\n-- second\nSELECT 2;\n"
    assert parse_queries(text) == {"one": "-- first\nSELECT 1;", "two_2": "-- second\nSELECT 2;"}


def test_to_native_numbers_each_name_once_in_order_of_first_use() -> None:
    sql = "SELECT %(b)s, %(a)b, %(b)s || '%%' WHERE x LIKE 'y%%' AND %(c)t"
    assert to_native(sql) == ("SELECT $1, $2, $1 || '%' WHERE x LIKE 'y%' AND $3", ("b", "a", "c"))


def test_the_claim_and_the_apply_have_only_native_placeholders() -> None:
    for name in ("job_claim", "job_apply_outcomes"):
        text, names = native(name)
        assert "%(" not in text and names
        assert f"${len(names)}" in text and f"${len(names) + 1}" not in text


def test_parse_queries_rejects_a_duplicate_name() -> None:
    """A name used twice raises ValueError naming it."""
    with pytest.raises(ValueError, match="duplicate query name 'dup'"):
        parse_queries("-- dup --\nSELECT 1;\n-- other --\nSELECT 2;\n-- dup --\nSELECT 3;\n")


def test_every_query_used_by_the_store_exists_in_queries_sql() -> None:
    """Every ``query("name")`` in shardworker/store names a block of queries.sql."""
    store_dir = Path(shardworker.store.__file__).parent
    source = "".join(p.read_text(encoding="utf-8") for p in sorted(store_dir.glob("*.py")))
    used = set(re.findall(r"""query\(\s*["']([a-z0-9_]+)["']\s*\)""", source))
    assert len(used) >= 15  # the regex really finds the calls
    assert used - set(queries()) == set()


def test_every_query_block_has_a_description_and_sql() -> None:
    """Every block in queries.sql opens with a one-line ``--`` description followed by SQL."""
    for name, sql in queries().items():
        lines = sql.splitlines()
        assert lines[0].startswith("-- "), name
        assert any(line.strip() and not line.startswith("--") for line in lines), name
