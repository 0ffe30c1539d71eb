"""The dashboard's queues, over HTTP against the real command on a real PostgreSQL: the
overview counts the same split as ``shardworker stats`` (available, scheduled, prefetched,
running, then done, failed, cancelled), each queue shows its state (paused, limits, the
oldest available job's age), and its buttons pause, resume, limit and clear it, guarded as
the job buttons are; bad input is a page saying why, never a 500, and changes nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from shardworker.core.views import FlowCount
from shardworker.store.pg_store import PgStore, StoreConfig
from tests.conftest import free_port
from tests.dashboard.conftest import Dashboard, fail, running_dashboard
from tests.helpers import enqueue, execute, query

CONSOLE = Path(sys.executable).parent / "shardworker"


def stats_json(dsn: str) -> dict[str, dict[str, int]]:
    env = {k: v for k, v in os.environ.items() if k != "SHARDWORKER_DSN"}
    done = subprocess.run([str(CONSOLE), "stats", "--json", "--dsn", dsn], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    found: dict[str, dict[str, int]] = json.loads(done.stdout)["queues"]
    return found


def press(board: Dashboard, action: str, origin: str | None = "same", **fields: str) -> httpx.Response:
    """A queue button's POST, as the page's form sends it."""
    headers = {"Origin": board.url} if origin == "same" else ({"Origin": origin} if origin else {})
    return httpx.post(f"{board.url}/queues/{action}", data=fields, headers=headers, follow_redirects=False,
                      auth=board.acting if board.action_token_kept else None)


def state(dsn: str, name: str) -> tuple[object, ...] | None:
    found = query(dsn, "SELECT paused, concurrency, rate_limit, rate_period_s FROM shardworker.queues WHERE name = %s",
                  name)
    return found[0] if found else None


def busy(dsn: str) -> None:
    """mail: 2 due (the oldest 3 minutes ago), 1 for later, 2 claimed of which a live worker
    reports 1 not started, 1 done; media: 1 failed; an empty queue paused and limited."""
    enqueue(dsn, "send", 4, queue="mail")
    enqueue(dsn, "send", 1, queue="mail", run_at=datetime.now(UTC) + timedelta(hours=1))
    [failed] = enqueue(dsn, "resize", 1, queue="media")
    fail(dsn, failed)
    [finished] = enqueue(dsn, "digest", 1, queue="mail")
    execute(dsn, "UPDATE shardworker.jobs SET status = 'done', finished_at = now() WHERE id = %s", finished)
    store = PgStore(StoreConfig(dsn=dsn))
    try:
        assert len(store.claim(["send"], ["mail"], "w1", 2)) == 2
        store.heartbeat("w1", "host", 1, 2, 0, [FlowCount("mail", "send", 1, 1)])
        store.pause_queue("idle")
        store.limit_queue("idle", concurrency=3)
    finally:
        store.close()
    execute(dsn, "UPDATE shardworker.jobs SET run_at = now() - interval '3 minutes' "
                 "WHERE queue = 'mail' AND status = 'queued' AND run_at <= now()")


def test_the_overview_counts_the_split_as_stats_does(pg_dsn: str, dashboard: Dashboard) -> None:
    """Each queue's available, scheduled, prefetched, running, done, failed and cancelled are
    the numbers `shardworker stats --json` prints; the kinds table splits the same way."""
    busy(pg_dsn)
    html = httpx.get(dashboard.url).text
    stats = stats_json(pg_dsn)
    for queue in ("mail", "media"):
        shown = {name: stats[queue][name] for name in ("available", "scheduled", "prefetched", "done", "failed",
                                                         "cancelled")}
        shown["running"] = stats[queue]["started"]
        for name, n in shown.items():
            assert f'data-count="{queue}/{name}">{n}<' in html, (queue, name, n)
    assert [stats["mail"][k] for k in ("available", "scheduled", "prefetched", "started")] == [2, 1, 1, 1]
    assert 'data-count="all/available">2<' in html and 'data-count="all/failed">1<' in html
    assert 'data-count="mail/send/prefetched">1<' in html and 'data-count="mail/send/scheduled">1<' in html
    assert 'data-count="media/resize/failed">1<' in html and "data-count=\"mail/queued\"" not in html


def test_each_queue_shows_its_state_and_buttons(pg_dsn: str, dashboard: Dashboard) -> None:
    """Paused or not, its limits, the oldest available job's age, and a Pause or Resume button
    and a limits form; a paused queue with no jobs is listed too, so it can be resumed."""
    busy(pg_dsn)
    html = httpx.get(dashboard.url).text
    assert 'data-queue="idle"' in html and 'data-paused="idle"' in html and 'data-paused="mail"' not in html
    assert 'data-concurrency="idle">3<' in html and 'data-rate="idle">-<' in html
    assert 'data-oldest="mail">3m<' in html and 'data-oldest="media">-<' in html
    assert 'data-queue-action="resume" data-for="idle"' in html and 'data-queue-action="pause" data-for="mail"' in html
    assert 'data-queue-action="limit" data-for="mail"' in html and 'data-queue-action="clear" data-for="idle"' in html
    assert 'data-queue-action="clear" data-for="mail"' not in html  # nothing to clear


def test_pause_and_resume_buttons(pg_dsn: str, dashboard: Dashboard) -> None:
    """Pause: the queue is paused for every worker, and the page says so; Resume undoes it."""
    enqueue(pg_dsn, "send", 1, queue="mail")
    paused = press(dashboard, "pause", queue="mail")
    assert paused.status_code == 303 and paused.headers["location"] == "/?done=pause&queue=mail"
    assert state(pg_dsn, "mail") == (True, None, None, None)
    page = httpx.get(dashboard.url + paused.headers["location"]).text
    assert "queue mail paused" in page and 'data-paused="mail"' in page
    resumed = press(dashboard, "resume", queue="mail")
    assert resumed.status_code == 303 and state(pg_dsn, "mail") == (False, None, None, None)
    assert "queue mail resumed" in httpx.get(dashboard.url + resumed.headers["location"]).text


def test_the_limits_form_sets_and_clears_limits(pg_dsn: str, dashboard: Dashboard) -> None:
    """Set both; a field left empty keeps its limit; Clear removes both. A queue name with
    spaces, slashes and non-ASCII travels intact."""
    name = "mail/eu west ü"
    enqueue(pg_dsn, "send", 1, queue=name)
    both = press(dashboard, "limit", queue=name, concurrency="5", rate="10/s")
    assert both.status_code == 303 and state(pg_dsn, name) == (False, 5, 10, 1.0)
    page = httpx.get(dashboard.url + both.headers["location"]).text
    assert f"queue {name}: concurrency 5, rate 10/s" in page
    assert press(dashboard, "limit", queue=name, concurrency="", rate=" 600/m ").status_code == 303
    assert state(pg_dsn, name) == (False, 5, 600, 60.0)
    cleared = press(dashboard, "clear", queue=name)
    assert cleared.status_code == 303 and state(pg_dsn, name) == (False, None, None, None)
    assert f"queue {name}: no limits" in httpx.get(dashboard.url + cleared.headers["location"]).text


@pytest.mark.parametrize(("action", "fields", "says"), [
    ("limit", {"queue": "mail", "rate": "10/x"}, "rate"),
    ("limit", {"queue": "mail", "concurrency": "abc"}, "concurrency must be a whole number"),
    ("limit", {"queue": "mail", "concurrency": "0"}, "concurrency must be a whole number"),
    ("limit", {"queue": "mail", "concurrency": "9" * 40}, "concurrency must be a whole number"),
    ("limit", {"queue": "mail", "concurrency": "", "rate": ""}, "give a concurrency, a key concurrency, a rate, or clear"),
    ("limit", {"queue": "mail", "concurrency": "5", "clear": "1"}, None),  # clear is its own button
    ("pause", {}, "queue name is empty"),
    ("pause", {"queue": "q" * 256}, "256 bytes"),
    ("resume", {"queue": "a\x00b"}, "queue name"),
])
def test_bad_input_is_a_page_saying_why_and_changes_nothing(pg_dsn: str, dashboard: Dashboard, action: str,
                                                            fields: dict[str, str], says: str | None) -> None:
    enqueue(pg_dsn, "send", 1, queue="mail")
    response = press(dashboard, action, **fields)
    if says is None:
        assert response.status_code == 303 and state(pg_dsn, "mail") == (False, 5, None, None)
        return
    assert response.status_code == 400, response.text[:500]
    assert "data-refused" in response.text and says in response.text and "Traceback" not in response.text
    assert "<html" in response.text and 'data-queue="mail"' in response.text  # the overview, with why
    assert query(pg_dsn, "SELECT count(*) FROM shardworker.queues") == [(0,)]


def test_a_form_that_is_no_form_is_a_400_and_an_unknown_button_a_404(pg_dsn: str, dashboard: Dashboard) -> None:
    headers = {"Origin": dashboard.url, "Content-Type": "application/x-www-form-urlencoded"}
    for body in (b"queue=%ff", b"queue=\xff", b"queue=" + b"q" * 20_000):
        response = httpx.post(f"{dashboard.url}/queues/pause", content=body, headers=headers, auth=dashboard.acting)
        assert response.status_code == 400 and "<html" in response.text, (body[:20], response.text[:300])
    assert press(dashboard, "explode", queue="mail").status_code == 404
    assert httpx.get(f"{dashboard.url}/queues/pause").status_code == 405
    assert query(pg_dsn, "SELECT count(*) FROM shardworker.queues") == [(0,)]


def test_a_notice_names_only_a_queue_the_page_lists(pg_dsn: str, dashboard: Dashboard) -> None:
    """The notice after a button repeats the queue's name from the URL only when that queue is
    on the page: a crafted link cannot make the page say anything else."""
    enqueue(pg_dsn, "send", 1, queue="mail")
    page = httpx.get(dashboard.url, params={"done": "pause", "queue": "your session expired, log in at evil"})
    assert page.status_code == 200 and "evil" not in page.text
    assert "queue mail paused" in httpx.get(dashboard.url, params={"done": "pause", "queue": "mail"}).text


def test_queue_buttons_are_guarded_as_the_job_buttons(pg_dsn: str, dashboard: Dashboard, tmp_path: Path) -> None:
    """Another origin, or none, gets 403; behind a token, no token gets 401; nothing changes."""
    for origin in ("http://evil.example", None, "null"):
        assert press(dashboard, "pause", origin=origin, queue="mail").status_code == 403
    with running_dashboard(pg_dsn, tmp_path, token="t0ken", host="0.0.0.0") as board:
        assert press(board, "pause", queue="mail").status_code == 401
        allowed = httpx.post(f"{board.url}/queues/pause", data={"queue": "mail"}, follow_redirects=False,
                             headers={"Origin": board.url, "Authorization": "Bearer t0ken"})
        assert allowed.status_code == 303
    assert state(pg_dsn, "mail") == (True, None, None, None)


def test_a_button_with_the_database_away_is_a_banner(tmp_path: Path) -> None:
    dsn = f"postgresql://app:hunter2@127.0.0.1:{free_port()}/app?connect_timeout=1"
    with running_dashboard(dsn, tmp_path) as board:
        response = press(board, "pause", queue="mail")
        assert response.status_code == 503 and "Database unavailable" in response.text
        assert "hunter2" not in response.text

