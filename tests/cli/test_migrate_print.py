"""`shardworker migrate --print --no-transaction`: the schema for tools that wrap each migration
in a transaction of their own (Alembic, Django), applied the way they apply it, through the
console script."""

from __future__ import annotations

import subprocess
import sys

import psycopg

from tests.helpers import REPO


def _shardworker(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "shardworker", *args], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)})


def test_no_transaction_script_applies_inside_the_tools_own_transaction(empty_dsn: str) -> None:
    script = _shardworker("migrate", "--print", "--no-transaction")
    assert script.returncode == 0, script.stderr
    statements = [line.strip().upper() for line in script.stdout.splitlines()]
    assert "BEGIN;" not in statements and "COMMIT;" not in statements
    assert "INSERT INTO SHARDWORKER.MIGRATIONS" in script.stdout.upper()  # `migrate` knows what it applied
    with psycopg.connect(empty_dsn) as conn, conn.transaction():  # as Django's atomic migration runs RunSQL
        conn.execute(script.stdout.encode())
    again = _shardworker("migrate", "--dsn", empty_dsn)
    assert again.returncode == 0 and again.stdout == "applied 0 migration(s)\n", again.stderr
    assert _shardworker("stats", "--dsn", empty_dsn).returncode == 0


def test_no_transaction_is_only_for_print() -> None:
    refused = _shardworker("migrate", "--no-transaction", "--dsn", "postgresql://nobody@127.0.0.1:1/none")
    assert refused.returncode == 2
    assert refused.stderr.splitlines()[-1] == "Error: --no-transaction goes with --print (shardworker migrate " \
                                              "applies each migration in a transaction of its own)"
