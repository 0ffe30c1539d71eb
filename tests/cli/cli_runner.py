"""What the command-line tests share: invoking ``shardworker`` in-process, the one-line
error check, and reading the jobs table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
from click.testing import CliRunner, Result
from psycopg import sql

from shardworker.cli.main import main

REPO = Path(__file__).resolve().parents[2]


def invoke(*args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(main, list(args), input=input, env={"SHARDWORKER_DSN": None,
                                                                  "SHARDWORKER_OUTBOX_DIR": None})


def assert_one_line_error(result: Result, *fragments: str) -> None:
    """Exit 1, nothing on stdout, exactly one ``error: ...`` line on stderr naming every fragment."""
    assert result.exit_code == 1, (result.exit_code, result.output)
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def rows(dsn: str, where: str = "TRUE") -> list[dict[str, Any]]:
    with psycopg.connect(dsn, autocommit=True) as conn, conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        cur.execute(sql.SQL("SELECT * FROM shardworker.jobs WHERE {} ORDER BY id").format(sql.SQL(where)))
        return cur.fetchall()
