"""The dashboard's input edges, over HTTP against the real command: query values and ids
that are not job ids get a page (400/404), never a 500; a stored integer beyond 64 bits is
shown exactly; any loopback address it is bound to answers its own URL."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.dashboard.conftest import Dashboard, running_dashboard
from tests.helpers import enqueue, execute

BIG = 18446744073709551616


@pytest.mark.parametrize("job", ["²", "٣", "1²", "9" * 5000, "-1", " 1"])
def test_a_notice_for_a_job_id_that_is_not_one_is_a_400_page(dashboard: Dashboard, job: str) -> None:
    for path in ("/", "/live/overview"):
        response = httpx.get(f"{dashboard.url}{path}", params={"done": "retry", "job": job})
        assert response.status_code == 400, (path, response.status_code, response.text[:300])
        assert "not a job id" in response.text
    assert "<html" in httpx.get(dashboard.url, params={"done": "retry", "job": job}).text


def test_a_notice_for_a_real_job_still_shows(pg_dsn: str, dashboard: Dashboard) -> None:
    [job_id] = enqueue(pg_dsn, "count", 1)
    page = httpx.get(f"{dashboard.url}/jobs/{job_id}", params={"done": "retry", "job": str(job_id)})
    assert page.status_code == 200 and f"job {job_id} queued again" in page.text


@pytest.mark.parametrize("job_id", ["99999999999999999999", "9" * 5000, "0"])
def test_an_id_no_job_can_have_is_a_404_page(dashboard: Dashboard, job_id: str) -> None:
    for path in (f"/jobs/{job_id}", f"/live/jobs/{job_id}"):
        response = httpx.get(f"{dashboard.url}{path}")
        assert response.status_code == 404, (path, response.status_code, response.text[:300])
        assert "<html" in response.text or path.startswith("/live/")
    response = httpx.post(f"{dashboard.url}/jobs/{job_id}/retry", headers={"Origin": dashboard.url},
                          auth=dashboard.acting)
    assert response.status_code == 404


def test_a_job_holding_an_integer_beyond_64_bits_is_shown_exactly(pg_dsn: str, dashboard: Dashboard) -> None:
    [job_id] = enqueue(pg_dsn, "count", 1)
    execute(pg_dsn, "UPDATE shardworker.jobs SET payload = %s::jsonb, result = %s::jsonb, status = 'done', "
                    "finished_at = now() WHERE id = %s", f'{{"n": {BIG}}}', f"[{-(10**40)}]", job_id)
    for path in (f"/jobs/{job_id}", f"/live/jobs/{job_id}", "/"):
        response = httpx.get(f"{dashboard.url}{path}")
        assert response.status_code == 200, (path, response.text[:300])
    page = httpx.get(f"{dashboard.url}/jobs/{job_id}").text
    assert str(BIG) in page and str(-(10**40)) in page


def test_bound_to_another_loopback_address_it_answers_its_own_url(pg_dsn: str, tmp_path: Path) -> None:
    with running_dashboard(pg_dsn, tmp_path, host="127.0.0.2") as board:
        own = board.url
        assert own.startswith("http://127.0.0.2:")
        response = httpx.get(own + "/")
        assert response.status_code == 200, response.text[:300]
        [job_id] = enqueue(pg_dsn, "count", 1)
        button = httpx.post(f"{own}/jobs/{job_id}/cancel", headers={"Origin": own}, follow_redirects=False,
                            auth=board.acting)
        assert button.status_code == 303
        assert httpx.get(own + "/", headers={"Host": "evil.example"}).status_code == 400
