"""``shardworker dashboard`` over HTTP, as a real subprocess on a real PostgreSQL: what the
page shows, who may see it (token, loopback), which POSTs it accepts (same origin only),
the retry and cancel buttons, a 404 page, and a banner when the database is away."""

from __future__ import annotations

import base64
import re
import socket
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx

from shardworker import jobs
from shardworker.dashboard import data
from tests.conftest import free_port
from tests.dashboard.conftest import Dashboard, command, dashboard_env, fail, running_dashboard
from tests.helpers import enqueue, execute, query


def status(dsn: str, job_id: int) -> str:
    return str(query(dsn, "SELECT status FROM shardworker.jobs WHERE id = %s", job_id)[0][0])


def post(board: Dashboard, path: str, origin: str | None = "same", back: str = "job") -> httpx.Response:
    headers = {"Origin": board.url} if origin == "same" else ({"Origin": origin} if origin else {})
    return httpx.post(f"{board.url}{path}", params={"back": back}, headers=headers, follow_redirects=False,
                      auth=board.acting)


def test_overview_shows_counts_failed_jobs_and_workers(pg_dsn: str, dashboard: Dashboard) -> None:
    """Counts by queue and by kind, a failed job with its error and a Retry button, a live worker."""
    ids = enqueue(pg_dsn, "thumbnail", 3)
    enqueue(pg_dsn, "mail", 2, queue="emails")
    fail(pg_dsn, ids[0], "OSError: <disk> full")
    execute(pg_dsn, "INSERT INTO shardworker.workers (worker_id, hostname, pid, heartbeat_at, jobs_running, "
                    "outbox_pending) VALUES ('w-1', 'host-a', 42, now(), 2, 17)")
    page = httpx.get(dashboard.url)
    assert page.status_code == 200
    html = page.text
    assert 'data-count="default/available">2<' in html and 'data-count="default/failed">1<' in html
    assert 'data-count="emails/mail/available">2<' in html and 'data-count="default/thumbnail/failed">1<' in html
    assert "OSError: &lt;disk&gt; full" in html  # escaped, never markup
    assert f'data-action="retry" data-job="{ids[0]}"' in html
    assert 'data-worker="w-1"' in html and "host-a" in html and "<td class=\"num\" data-pending=\"w-1\">17</td>" in html
    assert page.headers["x-frame-options"] == "DENY" and "default-src 'self'" in page.headers["content-security-policy"]
    fragment = httpx.get(f"{dashboard.url}/live/overview").text
    assert 'data-count="default/available">2<' in fragment and "<html" not in fragment


def test_overview_shows_the_slots_a_silent_worker_still_holds(pg_dsn: str, dashboard: Dashboard) -> None:
    """A worker silent for minutes is no longer live, but while its running jobs hold slots of a
    kind capped across workers it is listed with them, released once past its window."""
    execute(pg_dsn, "INSERT INTO shardworker.kinds (name, global_concurrency) VALUES ('api', 5)")
    execute(pg_dsn, "INSERT INTO shardworker.workers (worker_id, hostname, pid, heartbeat_at, slots_after_s) "
                    "VALUES ('w-dead', 'host', 1, now() - interval '5 minutes', 10), "
                    "('w-gone', 'host', 2, now() - interval '5 minutes', 10)")
    execute(pg_dsn, "INSERT INTO shardworker.jobs (kind, status, attempt, locked_by) "
                    "SELECT 'api', 'running', 1, 'w-dead' FROM generate_series(1, 2)")
    html = httpx.get(dashboard.url).text
    assert '<td data-slots="w-dead">kind api 2 (released: silent)</td>' in html
    assert 'data-worker="w-gone"' not in html  # silent and holding nothing: not shown


def test_retry_button_queues_a_failed_job_again(pg_dsn: str, dashboard: Dashboard) -> None:
    """POST /jobs/N/retry from the page: the job is queued again and the page says so."""
    [job_id] = enqueue(pg_dsn, "count", 1)
    fail(pg_dsn, job_id)
    response = post(dashboard, f"/jobs/{job_id}/retry", back="overview")
    assert response.status_code == 303 and response.headers["location"] == f"/?done=retry&job={job_id}"
    assert status(pg_dsn, job_id) == "queued"
    assert f"job {job_id} queued again" in httpx.get(dashboard.url + response.headers["location"]).text


def test_cancel_button_cancels_a_queued_job_and_a_running_one_and_refuses_a_done_one(
        pg_dsn: str, dashboard: Dashboard) -> None:
    """Cancel works on a queued job and on a running one (its worker stops the handler); on a
    done one it changes nothing and says why (409)."""
    queued, running, done = enqueue(pg_dsn, "count", 3)
    execute(pg_dsn, "UPDATE shardworker.jobs SET status = 'running', attempt = 1, locked_by = 'w' WHERE id = %s",
            running)
    execute(pg_dsn, "UPDATE shardworker.jobs SET status = 'done', attempt = 1 WHERE id = %s", done)
    response = post(dashboard, f"/jobs/{queued}/cancel", back="job")
    assert response.status_code == 303 and response.headers["location"] == f"/jobs/{queued}?done=cancel&job={queued}"
    assert status(pg_dsn, queued) == "cancelled"
    response = post(dashboard, f"/jobs/{running}/cancel", back="job")
    assert response.status_code == 303 and status(pg_dsn, running) == "cancelled"
    refused = post(dashboard, f"/jobs/{done}/cancel", back="job")
    assert refused.status_code == 409 and f"cannot cancel job {done}: it is done" in refused.text
    assert status(pg_dsn, done) == "done"


def test_cross_site_posts_are_refused(pg_dsn: str, dashboard: Dashboard) -> None:
    """A POST from another origin, or with no Origin or Referer at all, changes nothing (403)."""
    [job_id] = enqueue(pg_dsn, "count", 1)
    assert post(dashboard, f"/jobs/{job_id}/cancel", origin="http://evil.example").status_code == 403
    assert post(dashboard, f"/jobs/{job_id}/cancel", origin=None).status_code == 403
    assert post(dashboard, f"/jobs/{job_id}/cancel", origin="null").status_code == 403
    other_port = dashboard.url.rsplit(":", 1)[0] + f":{free_port()}"
    assert post(dashboard, f"/jobs/{job_id}/cancel", origin=other_port).status_code == 403
    assert status(pg_dsn, job_id) == "queued"
    referer = httpx.post(f"{dashboard.url}/jobs/{job_id}/cancel", headers={"Referer": f"{dashboard.url}/"},
                         auth=dashboard.acting)
    assert referer.status_code == 303 and status(pg_dsn, job_id) == "cancelled"


def test_a_script_presses_a_button_with_a_bearer_token_and_no_origin(pg_dsn: str, dashboard: Dashboard) -> None:
    """curl with the token as a Bearer header acts without an Origin (a browser never sends one
    by itself); basic auth without an Origin, or a wrong Bearer, gets a 403 that says how."""
    [job_id] = enqueue(pg_dsn, "count", 1)
    url = f"{dashboard.url}/jobs/{job_id}/cancel"
    basic = httpx.post(url, auth=dashboard.acting)
    assert basic.status_code == 403 and "Authorization: Bearer" in basic.text and "Origin" in basic.text
    wrong = httpx.post(url, headers={"Authorization": "Bearer not-the-token"})
    assert wrong.status_code == 403 and status(pg_dsn, job_id) == "queued"
    done = httpx.post(url, headers={"Authorization": f"Bearer {dashboard.action_token}"}, follow_redirects=False)
    assert done.status_code == 303 and status(pg_dsn, job_id) == "cancelled"


def test_a_foreign_host_name_is_refused_on_loopback(dashboard: Dashboard) -> None:
    """DNS rebinding: a page served as evil.example but resolving to 127.0.0.1 gets 400."""
    assert httpx.get(dashboard.url, headers={"Host": "evil.example:80"}).status_code == 400
    assert httpx.get(dashboard.url, headers={"Host": "localhost"}).status_code == 200


def test_unknown_job_is_a_404_page(pg_dsn: str, dashboard: Dashboard) -> None:
    """An id no job has, and a path that is no page, answer 404 with the dashboard's page."""
    missing = httpx.get(f"{dashboard.url}/jobs/999999")
    assert missing.status_code == 404 and "no job 999999" in missing.text and "<html" in missing.text
    assert httpx.get(f"{dashboard.url}/jobs/abc").status_code == 404
    assert post(dashboard, "/jobs/999999/retry").status_code == 404
    [job_id] = enqueue(pg_dsn, "count", 1)
    assert post(dashboard, f"/jobs/{job_id}/explode").status_code == 404


def test_job_page_shows_the_whole_job(pg_dsn: str, dashboard: Dashboard) -> None:
    """Payload, error and a Retry button on a failed job's page."""
    [job_id] = enqueue(pg_dsn, "count", 1, {"url": "https://example.com/a.png"})
    fail(pg_dsn, job_id, "Traceback-like\nsecond line")
    html = httpx.get(f"{dashboard.url}/jobs/{job_id}").text
    assert "https://example.com/a.png" in html and "second line" in html
    assert 'data-job-status>failed<' in html and f'data-action="retry" data-job="{job_id}"' in html


def test_job_page_lists_the_first_50_steps_then_how_many_more(pg_dsn: str, dashboard: Dashboard) -> None:
    """Name, attempt, when and size of each recorded step, in recorded order; past 50, a count
    of the rest. A job without steps has no steps table."""
    steps, plain = enqueue(pg_dsn, "count", 2)
    execute(pg_dsn, "INSERT INTO shardworker.job_steps (job_id, name, attempt, result, recorded_at) "
                    "SELECT %s, 'call <' || lpad(i::text, 2, '0') || '>', 1 + i / 50, to_jsonb(repeat('x', i)), "
                    "timestamptz '2030-01-02 03:04:05+00' + i * interval '1 s' FROM generate_series(1, 52) i", steps)
    for path in (f"/jobs/{steps}", f"/live/jobs/{steps}"):
        html = httpx.get(dashboard.url + path).text
        assert html.count("<tr data-step>") == 50 and "and 2 more" in html and "52 recorded" in html
        assert ("<td>call &lt;01&gt;</td><td class=\"num\">1</td><td>2030-01-02 03:04:06 UTC</td>"
                "<td class=\"num\">3 bytes</td>") in html  # the name escaped; the size of "x" in JSON
        assert html.index("call &lt;49&gt;") < html.index("call &lt;50&gt;") and "call &lt;51&gt;" not in html
    assert "data-steps" not in httpx.get(f"{dashboard.url}/jobs/{plain}").text


def test_non_loopback_bind_without_a_token_is_refused(pg_dsn: str) -> None:
    """--host 0.0.0.0 with no token: one error line, exit 2, nothing served."""
    done = subprocess.run(command(pg_dsn, free_port(), "--host", "0.0.0.0"), env=dashboard_env(),
                          capture_output=True, timeout=30)
    assert done.returncode == 2, done
    lines = done.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --host 0.0.0.0") and "--token" in lines[0]
    empty = subprocess.run(command(pg_dsn, free_port(), "--token", " "), env=dashboard_env(), capture_output=True,
                           timeout=30)
    assert empty.returncode == 2 and b"--token is empty" in empty.stderr


def test_a_port_in_use_is_one_line_and_exit_1(pg_dsn: str) -> None:
    """Another process on the port: the command says so in one line and exits 1."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(command(pg_dsn, port), env=dashboard_env(), capture_output=True, timeout=30)
    assert done.returncode == 1, done
    assert done.stderr.decode().strip() == f"error: cannot listen on 127.0.0.1:{port}: Address already in use"


def test_a_token_is_required_of_every_request(pg_dsn: str, tmp_path: Path) -> None:
    """Bound to 0.0.0.0 with a token: 401 (with a basic-auth challenge) without it or with a
    wrong one; the token as Bearer or as the basic-auth password gets in."""
    token = "s3cret-token"
    with running_dashboard(pg_dsn, tmp_path, token=token, host="0.0.0.0") as board:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic !!!"}):
            for path in ("/", "/live/overview", "/static/dashboard.js", "/jobs/1"):
                denied = httpx.get(board.url + path, headers=headers)
                assert denied.status_code == 401 and denied.headers["www-authenticate"].startswith("Basic ")
        assert httpx.get(board.url, headers={"Authorization": f"Bearer {token}"}).status_code == 200
        basic = base64.b64encode(f"ops:{token}".encode()).decode()
        assert httpx.get(board.url, headers={"Authorization": f"Basic {basic}"}).status_code == 200
        assert httpx.get(board.url, auth=("ops", "nope")).status_code == 401
        assert "token required" in board.output() and token not in board.output()


def test_on_loopback_without_a_token_the_buttons_need_the_one_it_keeps_in_the_outbox(pg_dsn: str,
                                                                                   tmp_path: Path) -> None:
    """Any local account can reach a loopback port: pages are open to it, the buttons are not
    (issue 41, 13). The dashboard makes a token, prints it, and keeps it in its outbox
    directory (0600 in 0700), where a restart finds it again; a POST without it, or with a
    wrong one, is a 401 with a basic-auth challenge (the browser asks), and changes nothing."""
    [job_id] = enqueue(pg_dsn, "count", 1)
    with running_dashboard(pg_dsn, tmp_path) as board:
        token_file = tmp_path / ".shardworker" / "outbox" / "dashboard-token"
        token = token_file.read_text().strip()
        assert len(token) >= 32 and token in board.output() and str(Path(".shardworker/outbox/dashboard-token")) in board.output()
        assert (token_file.stat().st_mode & 0o777, token_file.parent.stat().st_mode & 0o777) == (0o600, 0o700)
        assert httpx.get(board.url).status_code == 200 and httpx.get(f"{board.url}/jobs/{job_id}").status_code == 200
        for auth in (None, ("ops", "wrong"), ("ops", "")):
            denied = httpx.post(f"{board.url}/jobs/{job_id}/cancel", headers={"Origin": board.url}, auth=auth)
            assert denied.status_code == 401 and denied.headers["www-authenticate"].startswith("Basic ")
            assert "dashboard-token" in denied.text
            paused = httpx.post(f"{board.url}/queues/pause", data={"queue": "default"}, headers={"Origin": board.url},
                                auth=auth)
            assert paused.status_code == 401
        assert status(pg_dsn, job_id) == "queued" and query(pg_dsn, "SELECT count(*) FROM shardworker.queues") == [(0,)]
        allowed = httpx.post(f"{board.url}/jobs/{job_id}/cancel", headers={"Origin": board.url}, auth=("ops", token),
                             follow_redirects=False)
        assert allowed.status_code == 303 and status(pg_dsn, job_id) == "cancelled"
    with running_dashboard(pg_dsn, tmp_path) as board:  # a restart keeps the token a browser holds
        assert token_file.read_text().strip() == token


def test_a_dashboard_refuses_an_outbox_directory_others_can_write(pg_dsn: str, tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    done = subprocess.run(command(pg_dsn, free_port(), "--outbox-dir", str(shared)), env=dashboard_env(),
                          capture_output=True, timeout=30)
    lines = done.stderr.decode().strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1 and "writable by other users" in lines[0], done
    assert not (shared / "dashboard-token").exists()


def test_database_down_is_a_banner_not_a_traceback(tmp_path: Path) -> None:
    """With nothing listening at the DSN, pages answer 503 with a banner (password hidden)."""
    dsn = f"postgresql://app:hunter2@127.0.0.1:{free_port()}/app?connect_timeout=1"
    with running_dashboard(dsn, tmp_path) as board:
        for path in ("/", "/live/overview", "/jobs/5"):
            page = httpx.get(board.url + path, timeout=15)
            assert page.status_code == 503 and "Database unavailable" in page.text, page.text
            assert "Traceback" not in page.text and "hunter2" not in page.text
        assert "hunter2" not in board.output() and "***" in board.output()


def test_counts_and_throughput_read_the_last_hour(pg_dsn: str) -> None:
    """done_1h counts only jobs done within the hour; the chart has 60 minutes, the current
    one last, with each finished job in the minute it ended."""
    ids = enqueue(pg_dsn, "count", 5)
    now = query(pg_dsn, "SELECT now()")[0][0]
    ended = [now - timedelta(minutes=m) for m in (2, 2, 30, 180)]
    for job_id, at in zip(ids, ended, strict=False):
        execute(pg_dsn, "UPDATE shardworker.jobs SET status = 'done', finished_at = %s WHERE id = %s", at, job_id)
    execute(pg_dsn, "UPDATE shardworker.jobs SET status = 'failed', finished_at = %s WHERE id = %s", now, ids[4])
    seen = data.overview(pg_dsn)
    assert [(c.queue, c.kind, c.by_status["done_1h"], c.by_status["failed"]) for c in seen.kinds] == [
        ("default", "count", 3, 1)]
    assert len(seen.minutes) == 60 and seen.minutes[-1].start <= now < seen.minutes[-1].start + timedelta(minutes=1)
    assert sum(m.done for m in seen.minutes) == 3 and seen.minutes[-1].failed == 1
    two_ago = next(m for m in seen.minutes if m.start <= now - timedelta(minutes=2) < m.start + timedelta(minutes=1))
    assert two_ago.done == 2
    assert seen.totals == {"waiting": 0, "available": 0, "scheduled": 0, "prefetched": 0, "running": 0, "done": 4,
                           "failed": 1, "cancelled": 0}
    assert datetime.now(UTC) - seen.minutes[0].start < timedelta(minutes=61)


def link_row(side: str, job_id: int, kind: str) -> str:
    """A row of a job page's links table for a job that exists: its id, linked to its page, then its kind."""
    return f'<tr data-{side}="{job_id}"><td class="num"><a href="/jobs/{job_id}">{job_id}</a></td><td>{kind}</td>'


def test_job_pages_link_a_job_and_the_job_waiting_on_it(pg_dsn: str, dashboard: Dashboard) -> None:
    """A job enqueued after another: each page links to the other (waits on / waited on by,
    with kind and status); the waiting job counts as waiting by queue and by kind and has a
    Cancel button; once its dependency is deleted it lists it as deleted, without a link."""
    [split] = enqueue(pg_dsn, "split", 1)
    [merge] = enqueue(pg_dsn, "merge", 1, after=(split,))
    split_page = httpx.get(f"{dashboard.url}/jobs/{split}").text
    assert "Waited on by: 1 (1 waiting)" in split_page and "data-dependencies" not in split_page
    assert link_row("dependent", merge, "merge") in split_page
    merge_page = httpx.get(f"{dashboard.url}/jobs/{merge}").text
    assert "Waits on: 1 (1 queued)" in merge_page and "data-dependents" not in merge_page
    assert link_row("dependency", split, "split") in merge_page
    assert "data-job-status>waiting<" in merge_page and f'data-action="cancel" data-job="{merge}"' in merge_page
    overview = httpx.get(dashboard.url).text
    assert 'data-count="default/waiting">1<' in overview and 'data-count="default/merge/waiting">1<' in overview
    assert jobs.delete(pg_dsn, [split]) == 1
    gone = httpx.get(f"{dashboard.url}/live/jobs/{merge}").text
    assert f'<tr data-dependency="{split}"><td class="num">{split}</td><td></td><td>deleted</td>' in gone
    assert f"waited on job {split}, which was deleted" in gone and "data-job-status>cancelled<" in gone


def test_a_fan_in_page_lists_50_of_its_dependencies_and_counts_them_all_by_status(pg_dsn: str,
                                                                                 dashboard: Dashboard) -> None:
    """A merge after 52 parts, two of them done: its page counts them by status and lists the
    first 50 by id, then how many more."""
    parts = enqueue(pg_dsn, "part", 52)
    [merge] = enqueue(pg_dsn, "merge", 1, after=tuple(parts))
    execute(pg_dsn, "UPDATE shardworker.jobs SET status = 'done', finished_at = now() WHERE id = ANY(%s)", parts[-2:])
    html = httpx.get(f"{dashboard.url}/jobs/{merge}").text
    assert "Waits on: 52 (50 queued, 2 done)" in html and html.count("<tr data-dependency=") == 50
    assert f'data-dependency="{parts[49]}"' in html and f'data-dependency="{parts[50]}"' not in html
    assert "and 2 more (<code>shardworker jobs show" in html


def test_a_jobs_key_shows_on_its_page_and_in_the_lists(pg_dsn: str, dashboard: Dashboard) -> None:
    from shardworker import enqueue as enqueue_one

    job_id = enqueue_one(pg_dsn, "render", key="tenant-<42>")
    page = httpx.get(f"{dashboard.url}/jobs/{job_id}").text
    assert "<dd data-job-key>tenant-&lt;42&gt;</dd>" in page  # escaped, never markup
    assert '<span class="key" title="key">tenant-&lt;42&gt;</span>' in httpx.get(dashboard.url).text


def test_overview_shows_every_limit_across_workers_with_its_use(pg_dsn: str, dashboard: Dashboard) -> None:
    execute(pg_dsn, "INSERT INTO shardworker.kinds (name, global_concurrency, key_concurrency) VALUES ('api', 2, 1)")
    execute(pg_dsn, "INSERT INTO shardworker.queues (name, paused) VALUES ('mail', true)")
    execute(pg_dsn, "INSERT INTO shardworker.jobs (kind, status, attempt, key) "
                    "SELECT 'api', 'running', 1, 'acme' FROM generate_series(1, 2)")
    html = httpx.get(dashboard.url).text
    row = re.search(r'<tr data-limit="kind/api/global_concurrency">(.*?)</tr>', html, re.DOTALL)
    assert row and '<td class="num">2</td>' in row[1] and "full" in row[1]
    keys = re.search(r'<tr data-limit="kind/api/key_concurrency">(.*?)</tr>', html, re.DOTALL)
    assert keys and "(busiest key)" in keys[1] and "1 key at it" in keys[1]
    assert 'data-limit="queue/mail/paused"' in html


def test_waiting_jobs_show_what_they_wait_on_and_a_sleeper_can_be_woken(pg_dsn: str, dashboard: Dashboard) -> None:
    """The overview's Waiting jobs table and a job's page say what each waits on (a sleep till
    when, an event's key: escaped) and how far a job got; Wake queues a sleeper now and refuses
    an event's waiter (409, nothing changed)."""
    sleeper, waiter, reporter = enqueue(pg_dsn, "count", 3)
    execute(pg_dsn, "UPDATE shardworker.jobs SET status = 'waiting', attempt = 1, wait_kind = 'sleep', "
                    "wait_name = 'nap', wait_until = now() + interval '1 hour' WHERE id = %s", sleeper)
    execute(pg_dsn, "UPDATE shardworker.jobs SET status = 'waiting', attempt = 1, wait_kind = 'event', "
                    "wait_name = 'ok', wait_key = 'order:<7>' WHERE id = %s", waiter)
    execute(pg_dsn, "UPDATE shardworker.jobs SET status = 'running', attempt = 1, locked_by = 'w', "
                    "progress = '{\"pages\": 3}' WHERE id = %s", reporter)
    overview = httpx.get(dashboard.url).text
    waiting = overview.split("<h2>Waiting jobs</h2>")[1].split("</section>")[0]
    assert f'data-recent-job="{sleeper}"' in waiting and f'data-recent-job="{waiter}"' in waiting
    assert "event &#39;order:&lt;7&gt;&#39;" in waiting and "sleep until " in waiting
    assert 'data-progress>{"pages": 3}</span>' in overview  # Jinja's tojson: markup characters escaped
    assert "data-progress>" in httpx.get(f"{dashboard.url}/jobs/{reporter}").text
    page = httpx.get(f"{dashboard.url}/jobs/{waiter}").text
    assert "shardworker events send order:&lt;7&gt;" in page and 'data-action="wake"' not in page
    assert 'data-action="wake"' in httpx.get(f"{dashboard.url}/jobs/{sleeper}").text
    refused = post(dashboard, f"/jobs/{waiter}/wake", back="job")
    assert refused.status_code == 409 and "it waits for an event" in refused.text and status(pg_dsn, waiter) == "waiting"
    woken = post(dashboard, f"/jobs/{sleeper}/wake", back="overview")
    assert woken.status_code == 303 and status(pg_dsn, sleeper) == "queued"
    assert f"job {sleeper} woken" in httpx.get(dashboard.url + woken.headers["location"]).text


def test_search_finds_jobs_by_tag_and_error_and_its_bulk_buttons_act_on_all_of_them(
        pg_dsn: str, dashboard: Dashboard) -> None:
    """The search page lists the jobs its filters pick and counts what each bulk button would
    change; a button acts on every one of them (same-origin and token checks as the others),
    and comes back saying how many; a bad filter is one line, nothing changed."""
    from shardworker import JobSpec, enqueue_many

    tagged = enqueue_many(pg_dsn, [JobSpec("charge", tags=("billing", "customer:<1>")) for _ in range(3)])
    other = enqueue_many(pg_dsn, [JobSpec("charge", tags=("billing",))])
    for job_id in tagged[:2]:
        fail(pg_dsn, job_id)
    page = httpx.get(f"{dashboard.url}/search", params={"tag": "customer:<1>"}).text
    assert all(f'data-recent-job="{i}"' in page for i in tagged) and f'data-recent-job="{other[0]}"' not in page
    assert 'data-bulk-action="retry">Retry 2</button>' in page and 'data-bulk-action="cancel">Cancel 1</button>' in page
    assert 'value="customer:&lt;1&gt;"' in page  # escaped, never markup
    refused = httpx.post(f"{dashboard.url}/bulk/retry", data={"tag": "customer:<1>"}, follow_redirects=False,
                         headers={"Origin": "https://elsewhere.example"}, auth=dashboard.acting)
    assert refused.status_code == 403 and status(pg_dsn, tagged[0]) == "failed"
    response = httpx.post(f"{dashboard.url}/bulk/retry", data={"tag": "customer:<1>"}, follow_redirects=False,
                          headers={"Origin": dashboard.url}, auth=dashboard.acting)
    assert response.status_code == 303 and status(pg_dsn, tagged[0]) == "queued" and status(pg_dsn, tagged[1]) == "queued"
    assert "2 jobs queued again" in httpx.get(dashboard.url + response.headers["location"]).text
    bad = httpx.get(f"{dashboard.url}/search", params={"since": "yesterday"})
    assert bad.status_code == 400 and "expected a duration" in bad.text
    assert "<h2>Find jobs</h2>" in httpx.get(dashboard.url).text
