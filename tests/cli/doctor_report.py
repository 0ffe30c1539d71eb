"""What the ``shardworker doctor`` tests share: invoking it, its ``--json`` report, and
an outbox bound to its database with outcomes pending."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

from click.testing import CliRunner, Result

from outbox import ShardWriter
from outbox.fsutil import ensure_dir
from shardworker.cli.main import main
from shardworker.core import binding
from shardworker.core.model import Outcome
from shardworker.core.wire import encode_outcome
from shardworker.store.pg_store import PgStore
from tests.helpers import enqueue

REPO = Path(__file__).resolve().parents[2]
HEALTHY = ["database", "writable", "schema", "clock", "workers", "kinds", "horizon", "dead-rows", "connections",
           "outbox", "modes", "disk", "pending", "bound-to", "quarantine", "kept", "reapply"]


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, ["doctor", *args], env={"SHARDWORKER_DSN": None, "SHARDWORKER_OUTBOX_DIR": None})


def report(*args: str) -> tuple[int, dict[str, dict[str, Any]]]:
    """doctor --json: its exit code and its checks by name."""
    result = invoke("--json", *args)
    assert "Traceback" not in result.output, result.output
    doc = json.loads(result.stdout)
    assert doc["needs_action"] == (result.exit_code == 1), result.output
    return result.exit_code, {c["check"]: c for c in doc["checks"]}


def statuses(checks: dict[str, dict[str, Any]]) -> dict[str, str]:
    return {name: c["status"] for name, c in checks.items()}


def bound_outbox(directory: Path, store: PgStore) -> Path:
    """An outbox directory as a worker leaves it at its first start: 0700, bound to its database."""
    ensure_dir(str(directory))
    binding.bind(str(directory), store)
    return directory


def pending_outcomes(directory: Path, store: PgStore, dsn: str, count: int = 3) -> list[int]:
    """Claim ``count`` jobs and append their outcomes (fsync'd) to shard 0, as a child would;
    no worker is left running. Returns the job ids."""
    enqueue(dsn, "k", count)
    jobs = store.claim(["k"], None, "w-gone", count)
    with ShardWriter.open(str(directory), 0) as writer:
        for job in jobs:
            writer.append_bytes(encode_outcome(Outcome.done(job.id, job.attempt, b'{"r": 1}')))
        writer.commit()
    return [j.id for j in jobs]


def refused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
