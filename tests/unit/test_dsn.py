"""Unit tests of ``shardworker.core.dsn.redact_dsn``: passwords hidden in URL and key=value DSNs."""

from __future__ import annotations

import pytest

from shardworker.core.dsn import redact_dsn


@pytest.mark.parametrize(("dsn", "expected"), [
    ("postgresql://alice:s3cret@db.example:5432/jobs", "postgresql://alice:***@db.example:5432/jobs"),
    ("postgres://:s3cret@localhost/jobs", "postgres://:***@localhost/jobs"),
    ("host=db user=alice password=s3cret dbname=jobs", "host=db user=alice password=*** dbname=jobs"),
    ("host=db password = 's3 cret' dbname=jobs", "host=db password = *** dbname=jobs"),
    ("host=db PASSWORD=s3cret", "host=db PASSWORD=***"),
    ("postgresql://db/jobs?user=alice&password=s3cret", None),
    ("postgresql://alice@db/jobs", "postgresql://alice@db/jobs"),
    ("host=db user=alice dbname=jobs", "host=db user=alice dbname=jobs"),
])
def test_redact_dsn_hides_passwords(dsn: str, expected: str | None) -> None:
    """redact_dsn removes the password from URL and key=value DSNs and leaves others untouched."""
    redacted = redact_dsn(dsn)
    assert "s3cret" not in redacted and "s3 cret" not in redacted
    if expected is not None:
        assert redacted == expected
