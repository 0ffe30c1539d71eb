"""Numbers are never changed on their way through a worker: a row that holds an integer
beyond 64 bits (enqueue refuses them, but SQL written by other means can store one) reaches
its handler exactly, and a result holding one is stored exactly."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import exit_code, query, start_worker

BIG = 123456789012345678901234567890


def test_an_integer_beyond_64_bits_reaches_the_handler_and_the_result_exactly(pg_dsn: str, tmp_path: Path) -> None:
    count_dir = tmp_path / "counts"
    count_dir.mkdir()
    (job_id,) = query(pg_dsn, "INSERT INTO shardworker.jobs (kind, payload) VALUES ('count', %s::jsonb) "
                              "RETURNING id", f'{{"n": {BIG}, "small": 1.5}}')[0]
    proc = start_worker(pg_dsn, tmp_path / "outbox", count_dir, "--exit-when-idle", procs=1)
    assert exit_code(proc, 60, count_dir) == 0
    status, n, small = query(pg_dsn, "SELECT status, result->'echo'->>'n', result->'echo'->>'small' "
                                     "FROM shardworker.jobs WHERE id = %s", job_id)[0]
    assert (status, n, small) == ("done", str(BIG), "1.5")
