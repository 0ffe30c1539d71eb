"""Only the current formats of the files in an outbox directory are read: the project was
never released with another, so a file of an earlier development shape is refused with
what to do, never half-read."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from shardworker.core import binding, layout
from shardworker.errors import ShardworkerError


def test_a_binding_without_its_embedded_flag_is_refused_as_damaged(tmp_path: Path) -> None:
    doc = {"instance": "i", "database": "d", "server": "h:5432"}
    (tmp_path / binding.DATABASE_FILE).write_bytes(orjson.dumps(doc))
    with pytest.raises(ShardworkerError, match="is damaged"):
        binding.bound_to(str(tmp_path))
    (tmp_path / binding.DATABASE_FILE).write_bytes(orjson.dumps({**doc, "embedded": False}))
    assert binding.bound_to(str(tmp_path)) == binding.Binding("i", "d", "h:5432", False)


def test_a_giveback_list_without_its_claims_is_refused(tmp_path: Path) -> None:
    (tmp_path / layout.GIVEBACK_FILE).write_bytes(orjson.dumps({"version": 1, "workers": {"w": {"jobs": [[1, 2]]}}}))
    with pytest.raises(ShardworkerError, match="unreadable"):
        layout.read_giveback(str(tmp_path))
    (tmp_path / layout.GIVEBACK_FILE).write_bytes(
        orjson.dumps({"version": 1, "workers": {"w": {"jobs": [[1, 2]], "claims": ["tok"]}}}))
    assert layout.read_giveback(str(tmp_path)) == {"w": {"jobs": [[1, 2]], "claims": ["tok"]}}
