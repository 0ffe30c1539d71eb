"""The dashboard in a real browser: headless Chromium (the Debian ``chromium`` package)
driven by Playwright. A failed job retried with its button is run by a real worker and
shows up done without a reload; a queued job is cancelled from its page; the counts follow
new jobs live. Skipped, saying why, only where no Chromium is installed (``.ci/run``
installs it)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from shardworker.embedded import EmbeddedPostgres
from tests.dashboard.conftest import Dashboard, fail, running_dashboard
from tests.dashboard.test_dashboard_outage import busy
from tests.helpers import enqueue, execute, query, start_worker

CHROMIUM = os.environ.get("SHARDWORKER_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
# As root Chromium needs --no-sandbox; the rest keeps it off a network it could not reach anyway.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]
LIVE_TIMEOUT_MS = 10_000  # the page refreshes every 2 s; a worker's first job takes a second or two more

sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright for Python is not installed "
                               "(pip install playwright: the test extra)")
expect = sync_api.expect


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium; .ci/run does it as root)")
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Any, dashboard: Dashboard) -> Iterator[Any]:
    """A page of the loopback dashboard, whose browser answers its buttons' basic-auth
    challenge with the token the dashboard printed."""
    context = browser.new_context(base_url=dashboard.url,
                                  http_credentials={"username": "ops", "password": dashboard.action_token})
    yield context.new_page()
    context.close()



def test_retry_in_the_browser_then_a_worker_runs_it(pg_dsn: str, browser: Any, tmp_path: Path) -> None:
    """Behind a token (basic auth): the failed job shows its error; Retry queues it again; a
    real worker runs it, and the page, never reloaded, shows it done with no failed job left."""
    [job_id] = enqueue(pg_dsn, "count", 1, {"n": 7})
    fail(pg_dsn, job_id, "ConnectionError: upstream said 503")
    (tmp_path / "counts").mkdir()
    start_worker(pg_dsn, tmp_path / "outbox", tmp_path / "counts", procs=1)  # claims nothing until the retry
    with running_dashboard(pg_dsn, tmp_path, token="t0ken") as board:
        context = browser.new_context(base_url=board.url, http_credentials={"username": "ops", "password": "t0ken"})
        page = context.new_page()
        page.goto("/")
        row = page.locator(f'[data-failed-job="{job_id}"]')
        expect(row).to_contain_text("ConnectionError: upstream said 503")
        row.locator('button[data-action="retry"]').click()
        expect(page.locator(".notice")).to_have_text(f"job {job_id} queued again")
        page.evaluate("window.notReloaded = true")
        status = page.locator(f'[data-recent-job="{job_id}"] [data-status]')
        expect(status).to_have_text("done", timeout=LIVE_TIMEOUT_MS)
        expect(page.locator("[data-failed-job]")).to_have_count(0)
        expect(page.locator('[data-count="all/done"]')).to_have_text("1")
        assert page.evaluate("window.notReloaded") is True
        page.locator(f'[data-recent-job="{job_id}"] a').click()
        expect(page.locator("[data-result]")).to_contain_text('"echo"')
        context.close()
    assert query(pg_dsn, "SELECT status, attempt FROM shardworker.jobs WHERE id = %s", job_id) == [("done", 2)]


def test_cancel_a_queued_job_from_its_page(pg_dsn: str, page: Any) -> None:
    """The job page's Cancel button cancels the queued job and the page shows it cancelled."""
    [job_id] = enqueue(pg_dsn, "count", 1)
    page.goto(f"/jobs/{job_id}")
    expect(page.locator("[data-job-status]")).to_have_text("queued")
    page.locator('button[data-action="cancel"]').click()
    expect(page.locator(".notice")).to_have_text(f"job {job_id} cancelled")
    expect(page.locator("[data-job-status]")).to_have_text("cancelled")
    expect(page.locator('button[data-action="retry"]')).to_be_visible()  # a cancelled job may be retried
    assert query(pg_dsn, "SELECT status FROM shardworker.jobs WHERE id = %s", job_id) == [("cancelled",)]


def test_a_button_pressed_without_the_token_changes_nothing(pg_dsn: str, browser: Any, dashboard: Dashboard) -> None:
    """Another account's browser on this machine reads the page; its Cancel is refused (the
    401 a browser asks for the token with), and the job stays queued."""
    [job_id] = enqueue(pg_dsn, "count", 1)
    context = browser.new_context(base_url=dashboard.url)
    page = context.new_page()
    page.goto(f"/jobs/{job_id}")
    expect(page.locator("[data-job-status]")).to_have_text("queued")
    with page.expect_response(lambda response: response.request.method == "POST") as refused:
        page.locator('button[data-action="cancel"]').click()
    assert refused.value.status == 401
    context.close()
    assert query(pg_dsn, "SELECT status FROM shardworker.jobs WHERE id = %s", job_id) == [("queued",)]


def test_counts_follow_new_jobs_without_a_reload(pg_dsn: str, page: Any) -> None:
    """Jobs enqueued after the page loaded appear in its counts within a few seconds."""
    page.goto("/")
    expect(page.locator("#live")).to_contain_text("no jobs yet")
    page.evaluate("window.notReloaded = true")
    enqueue(pg_dsn, "thumbnail", 3, queue="media")
    expect(page.locator('[data-count="media/available"]')).to_have_text("3", timeout=LIVE_TIMEOUT_MS)
    expect(page.locator('[data-count="media/thumbnail/available"]')).to_have_text("3")
    assert page.evaluate("window.notReloaded") is True
    expect(page.locator("#live-status")).to_contain_text("live ·")


def test_an_outage_greys_the_page_under_one_banner_and_the_return_brings_it_back(
        browser: Any, private_pg: EmbeddedPostgres, tmp_path: Path) -> None:
    """PostgreSQL stopped under an open page: the counts and the worker's outbox backlog stay,
    greyed, under one banner with the time of the data, and the corner says the database is
    away; PostgreSQL back, the page is live again, never reloaded."""
    busy(private_pg.dsn)
    with running_dashboard(private_pg.dsn, tmp_path) as board:
        context = browser.new_context(base_url=board.url)
        page = context.new_page()
        page.goto("/")
        expect(page.locator('[data-count="media/available"]')).to_have_text("3")
        page.evaluate("window.notReloaded = true")
        private_pg.stop("immediate")
        expect(page.locator("[data-banner]")).to_have_count(1, timeout=LIVE_TIMEOUT_MS)
        expect(page.locator("[data-banner]")).to_contain_text("the data read at")
        expect(page.locator("#live [data-stale]")).to_be_visible()
        expect(page.locator('[data-count="media/available"]')).to_have_text("3")
        expect(page.locator('[data-pending="w-outage"]')).to_have_text("867")
        expect(page.locator("#live-status")).to_contain_text("database unavailable")
        private_pg.start()
        expect(page.locator("[data-banner]")).to_have_count(0, timeout=LIVE_TIMEOUT_MS)
        expect(page.locator("[data-stale]")).to_have_count(0)
        expect(page.locator("#live-status")).to_contain_text("live ·")
        assert page.evaluate("window.notReloaded") is True
        context.close()


def test_unknown_job_page_in_the_browser(page: Any) -> None:
    """An unknown job id shows the dashboard's own 404 page."""
    response = page.goto("/jobs/424242")
    assert response is not None and response.status == 404
    expect(page.locator("[data-not-found]")).to_have_text("no job 424242")


def test_screenshot_of_a_busy_dashboard(pg_dsn: str, page: Any, tmp_path: Path) -> None:
    """A dashboard with an hour of history, a failure and a live worker renders its chart;
    the screenshot goes to $DASHBOARD_SCREENSHOT when set (docs/dashboard.png is made so)."""
    seed_an_hour(pg_dsn)
    page.set_viewport_size({"width": 1180, "height": 1400})
    page.goto("/")
    expect(page.locator("svg.chart rect.done")).not_to_have_count(0)
    expect(page.locator("svg.chart rect.failed")).not_to_have_count(0)
    expect(page.locator("[data-worker]")).to_have_count(2)
    shot = tmp_path / "dashboard.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if os.environ.get("DASHBOARD_SCREENSHOT"):
        shutil.copyfile(shot, os.environ["DASHBOARD_SCREENSHOT"])


def seed_an_hour(dsn: str) -> None:
    """Jobs of three kinds finished over the last hour at a varying pace, a few failed with
    errors, some queued (due or for later) and running, two live workers (one reporting
    prefetched jobs), a paused queue and a limited one."""
    for kind, queue, n in (("thumbnail", "media", 900), ("send_email", "mail", 500), ("charge", "payments", 160)):
        enqueue(dsn, kind, n, {"demo": True}, queue=queue)
    now = query(dsn, "SELECT now()")[0][0]
    execute(dsn, "UPDATE shardworker.jobs SET status = 'done', attempt = 1, result = '{\"ok\": true}', "
                 "finished_at = %s - make_interval(secs => (id * 7919) %% 3600) WHERE id %% 10 <> 0", now)
    execute(dsn, "UPDATE shardworker.jobs SET status = 'failed', attempt = max_attempts, finished_at = %s "
                 "- make_interval(secs => (id * 31) %% 3000), last_error = CASE WHEN kind = 'charge' "
                 "THEN 'Fail: card declined' ELSE 'TimeoutError: upstream did not answer in 30s' END "
                 "WHERE id %% 97 = 0", now - timedelta(seconds=5))
    execute(dsn, "UPDATE shardworker.jobs SET status = 'running', attempt = 1, locked_by = 'web-1' "
                 "WHERE status = 'queued' AND id % 3 = 0")
    execute(dsn, "UPDATE shardworker.jobs SET run_at = now() + interval '1 hour' "
                 "WHERE status = 'queued' AND id % 3 = 1")
    execute(dsn, "UPDATE shardworker.jobs SET run_at = now() - interval '95 seconds' WHERE status = 'queued' "
                 "AND run_at <= now()")
    execute(dsn, "INSERT INTO shardworker.workers (worker_id, hostname, pid, heartbeat_at, jobs_running, "
                 "outbox_pending, flow) VALUES ('web-1', 'app-host-1', 4242, now(), 18, 3, "
                 "'[[\"media\", \"thumbnail\", 12, 6]]'), ('web-2', 'app-host-2', 5151, now(), 11, 0, NULL)")
    execute(dsn, "INSERT INTO shardworker.queues (name, paused, concurrency, rate_limit, rate_period_s) "
                 "VALUES ('payments', true, NULL, NULL, NULL), ('mail', false, 5, 10, 1)")


def test_pause_a_queue_and_set_its_limits_in_the_browser(pg_dsn: str, page: Any) -> None:
    """Pause, then Resume; limits typed survive the page's refreshes until Set; a bad rate is
    refused on the page saying why; Clear removes the limits."""
    enqueue(pg_dsn, "thumbnail", 2, queue="media")
    page.goto("/")
    row = page.locator('[data-queue="media"]')
    row.locator('button[data-queue-action="pause"]').click()
    expect(page.locator(".notice")).to_have_text("queue media paused")
    expect(page.locator('[data-paused="media"]')).to_be_visible()
    page.locator('button[data-queue-action="resume"][data-for="media"]').click()
    expect(page.locator(".notice")).to_have_text("queue media resumed")
    row.locator('input[name="concurrency"]').fill("4")
    page.locator("body").click()  # the field loses focus: only its typed value holds the refresh back
    expect(page.locator("#live")).to_have_attribute("data-held", "true", timeout=LIVE_TIMEOUT_MS)
    expect(page.locator("#live-status")).to_contain_text("held while you edit")
    expect(row.locator('input[name="concurrency"]')).to_have_value("4")
    row.locator('input[name="rate"]').fill("5/fortnight")
    row.locator('button[data-queue-action="limit"]').click()
    expect(page.locator("[data-refused]")).to_contain_text("rate must look like 10/s")
    assert query(pg_dsn, "SELECT count(*) FROM shardworker.queues WHERE concurrency IS NOT NULL") == [(0,)]
    row.locator('input[name="concurrency"]').fill("4")
    row.locator('input[name="rate"]').fill("10/s")
    row.locator('button[data-queue-action="limit"]').click()
    expect(page.locator(".notice")).to_have_text("queue media: concurrency 4, rate 10/s")
    expect(page.locator('[data-concurrency="media"]')).to_have_text("4")
    page.locator('button[data-queue-action="clear"][data-for="media"]').click()
    expect(page.locator(".notice")).to_have_text("queue media: no limits")
    assert query(pg_dsn, "SELECT paused, concurrency, rate_limit FROM shardworker.queues WHERE name = 'media'") == [
        (False, None, None)]
