"""``shardworker queues`` through the console script, as an operator runs it: the table and
``--json``, ``pause``, ``resume``, ``limit`` and ``limit --clear``, and bad input refused
with exit 2 and one error line, nothing written. Real PostgreSQL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.helpers import enqueue, execute, query

CONSOLE = Path(sys.executable).parent / "shardworker"


def shardworker(*args: str, dsn: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "SHARDWORKER_DSN"}
    if dsn is not None:
        env["SHARDWORKER_DSN"] = dsn
    return subprocess.run([str(CONSOLE), *args], env=env, capture_output=True, text=True, timeout=60)


def ok(*args: str, dsn: str) -> str:
    done = shardworker(*args, dsn=dsn)
    assert done.returncode == 0, done.stderr
    return done.stdout


def states(dsn: str) -> list[tuple[object, ...]]:
    return query(dsn, "SELECT name, paused, concurrency, rate_limit, rate_period_s FROM shardworker.queues "
                      "ORDER BY name")


def test_the_table_and_json_show_each_queue_its_state_and_backlog(pg_dsn: str) -> None:
    """Jobs due, scheduled and claimed in two queues; the table has a row per queue with every
    column, and --json the same numbers."""
    assert "no queues" in ok("queues", dsn=pg_dsn)
    enqueue(pg_dsn, "send", 3, queue="mail")
    enqueue(pg_dsn, "send", 2, queue="mail", run_at=datetime.now(UTC) + timedelta(hours=1))
    enqueue(pg_dsn, "resize", 1, queue="images")
    execute(pg_dsn, "UPDATE shardworker.jobs SET status = 'running', attempt = 1 WHERE queue = 'images'")
    execute(pg_dsn, "UPDATE shardworker.jobs SET run_at = now() - interval '3 minutes' "
                    "WHERE queue = 'mail' AND run_at <= now()")
    ok("queues", "limit", "mail", "--concurrency", "5", "--rate", "10/s", dsn=pg_dsn)
    lines = ok("queues", dsn=pg_dsn).splitlines()
    assert lines[0].split() == ["queue", "paused", "concurrency", "rate", "per", "key", "available", "scheduled",
                                "prefetched", "running", "oldest"]
    assert lines[1].split() == ["images", "no", "-", "-", "-", "0", "0", "0", "1", "-"]
    assert lines[2].split() == ["mail", "no", "5", "10/s", "-", "3", "2", "0", "0", "3m"]
    listed = {q["queue"]: q for q in json.loads(ok("queues", "--json", dsn=pg_dsn))}
    assert listed["mail"]["rate"] == "10/s" and listed["mail"]["available"] == 3
    assert 180 <= listed["mail"]["oldest_available_s"] < 240
    assert listed["images"] == {"queue": "images", "paused": False, "concurrency": None, "rate": None,
                                "available": 0, "scheduled": 0, "prefetched": 0, "running": 1,
                                "oldest_available_s": None, "key_concurrency": None, "key_weights": None}


def test_pause_limit_clear_and_resume_change_only_what_they_name(pg_dsn: str) -> None:
    assert ok("queues", "pause", "mail", dsn=pg_dsn).strip() == "queue mail paused"
    assert states(pg_dsn) == [("mail", True, None, None, None)]
    shown = json.loads(ok("queues", "limit", "mail", "--rate", "600/m", "--json", dsn=pg_dsn))
    assert shown == {"queue": "mail", "paused": True, "concurrency": None, "rate": "600/m", "key_concurrency": None,
                     "key_weights": None}
    ok("queues", "limit", "mail", "--concurrency", "3", dsn=pg_dsn)
    assert states(pg_dsn) == [("mail", True, 3, 600, 60.0)]
    assert "paused" in ok("queues", dsn=pg_dsn).splitlines()[0] and " yes " in ok("queues", dsn=pg_dsn)
    assert ok("queues", "limit", "mail", "--clear", dsn=pg_dsn).strip() == "queue mail: no limits (paused)"
    assert ok("queues", "resume", "mail", dsn=pg_dsn).strip() == "queue mail resumed"
    assert states(pg_dsn) == [("mail", False, None, None, None)]


def test_the_groups_own_dsn_option_reaches_its_commands(pg_dsn: str) -> None:
    """`queues --dsn X pause q` acts on X, not on the embedded server nor on SHARDWORKER_DSN."""
    done = shardworker("queues", "--dsn", pg_dsn, "pause", "mail")
    assert done.returncode == 0, done.stderr
    assert "embedded" not in done.stderr
    done = shardworker("queues", "--dsn", pg_dsn, "limit", "mail", "--concurrency", "2",
                       dsn="postgresql://nobody@127.0.0.1:1/elsewhere")
    assert done.returncode == 0, done.stderr
    assert states(pg_dsn) == [("mail", True, 2, None, None)]


@pytest.mark.parametrize(("args", "fragment"), [
    (("limit", "mail"), "give --concurrency, --key-concurrency, --rate, --weight or --clear"),
    (("limit", "mail", "--clear", "--rate", "1/s"), "--clear removes every limit"),
    (("limit", "mail", "--rate", "10/day"), "rate must look like 10/s"),
    (("limit", "mail", "--concurrency", "0"), "--concurrency"),
    (("limit", "mail", "--weight", "acme"), "expected KEY=W"),
    (("pause", ""), "queue name is empty"),
    (("resume", "q" * 256), "the limit is 255"),
    (("pause",), "Missing argument 'NAME'"),
])
def test_bad_input_exits_2_with_one_error_line_and_writes_nothing(pg_dsn: str, args: tuple[str, ...],
                                                                  fragment: str) -> None:
    done = shardworker("queues", *args, dsn=pg_dsn)
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and fragment in errors[0], done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert states(pg_dsn) == []


def test_weights_are_set_merged_shown_and_cleared(pg_dsn: str) -> None:
    assert ok("queues", "limit", "mail", "--weight", "acme=3", dsn=pg_dsn).strip() == "queue mail: weights acme=3"
    shown = ok("queues", "limit", "mail", "--weight", "beta=2", "--key-concurrency", "4", dsn=pg_dsn).strip()
    assert shown == "queue mail: key concurrency 4, weights acme=3 beta=2"
    zero = shardworker("queues", "limit", "mail", "--weight", "acme=0", dsn=pg_dsn)
    assert zero.returncode == 2 and "a whole number from 1 to 1000" in zero.stderr
    ok("enqueue", "k", "--queue", "mail", dsn=pg_dsn)
    assert "queue mail: keys' weights acme=3 beta=2" in ok("queues", dsn=pg_dsn)
    assert [q["key_weights"] for q in json.loads(ok("queues", "--json", dsn=pg_dsn))] == [{"acme": 3, "beta": 2}]
    assert ok("queues", "limit", "mail", "--clear", dsn=pg_dsn).strip() == "queue mail: no limits"
    assert query(pg_dsn, "SELECT key_weights FROM shardworker.queues") == [(None,)]
