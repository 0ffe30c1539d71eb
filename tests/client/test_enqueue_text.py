"""Names and keys that PostgreSQL's text cannot hold (a lone surrogate, as ``os.listdir`` or
``sys.argv`` give for bytes that are not UTF-8; a NUL) are refused at enqueue in one line,
and nothing is inserted."""

from __future__ import annotations

import pytest

from shardworker.client import JobSpec, enqueue, enqueue_many
from shardworker.errors import EnqueueError
from tests.helpers import query

BAD = [("kind", "report-\udcff"), ("queue", "q\udcff"), ("dedupe_key", "key-\udcff"), ("kind", "a\x00b"),
       ("queue", "q\x00"), ("dedupe_key", "k\x00")]


@pytest.mark.parametrize(("field", "value"), BAD)
def test_text_the_database_cannot_hold_is_refused_in_one_line(pg_dsn: str, field: str, value: str) -> None:
    options = {"kind": "k", "queue": "default", "dedupe_key": None, field: value}
    with pytest.raises(EnqueueError, match=f"^{field} ") as refused:
        enqueue(pg_dsn, options.pop("kind"), None, **options)
    assert "\n" not in str(refused.value)
    with pytest.raises(EnqueueError, match=f"^{field} "):
        enqueue_many(pg_dsn, [JobSpec("ok", None), JobSpec(**{"kind": "k", field: value})])
    assert query(pg_dsn, "SELECT count(*) FROM shardworker.jobs") == [(0,)]
